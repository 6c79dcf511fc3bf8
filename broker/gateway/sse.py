"""The streaming hot path: result-stream entries to Server-Sent Events, bytes as they are.

Each chunk entry already holds complete ``data: {...}\\n\\n`` events as the engine
sent them, so chunks pass through without JSON parsing, logging or Redis calls
of their own. Whatever the reader delivered since the last write goes out as one
body message, so a burst of tokens costs one ``send``. The end event adds an
error event when the job did not complete (see ``outcomes``), then ``[DONE]``.
While nothing arrives (queued, or a slow first token) a comment line every
``HEARTBEAT_S`` keeps proxies from closing an idle connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from broker.gateway.errors import JOB_HEADER
from broker.gateway.followed import FollowedJob
from broker.gateway.outcomes import SHUTDOWN, ended_error
from broker.results import ResultEvent

HEARTBEAT_S = 15.0
_KEEPALIVE = b": keep-alive\n\n"
_DONE = b"data: [DONE]\n\n"


async def _next_batch(queue: asyncio.Queue[ResultEvent]) -> list[ResultEvent] | None:
    """The events that have arrived (at least one, up to an end event); None on a lull."""
    if queue.empty():
        try:
            async with asyncio.timeout(HEARTBEAT_S):
                first = await queue.get()
        except TimeoutError:
            return None
    else:
        first = queue.get_nowait()
    batch = [first]
    while first.end is None and first is not SHUTDOWN and not queue.empty():
        first = queue.get_nowait()
        batch.append(first)
    return batch


def _end_frame(event: ResultEvent) -> bytes:
    error = ended_error(event)
    if error is None:
        return _DONE
    return b"data: " + orjson.dumps(error.to_body()) + b"\n\n" + _DONE


async def sse_events(job: FollowedJob) -> AsyncIterator[bytes]:
    while True:
        batch = await _next_batch(job.events)
        if batch is None:
            yield _KEEPALIVE
            continue
        data = b"".join([e.chunk for e in batch if e.chunk is not None])
        last = batch[-1]
        if last.end is not None:
            job.ended = True  # before the write: a client leaving now cancels nothing
            yield data + _end_frame(last)
            return
        if last is SHUTDOWN:
            yield data + _end_frame(last)  # job.ended stays False: release cancels the job
            return
        if data:
            yield data


class JobStreamResponse(StreamingResponse):
    """An SSE response that releases its job however the response ends."""

    def __init__(self, job: FollowedJob) -> None:
        headers = {JOB_HEADER: job.id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(sse_events(job), headers=headers, media_type="text/event-stream")
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Starlette watches for the client's disconnect and cancels the stream; the
        # generator may never have started, so release here rather than in it.
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.job.gateway.finish(self.job.release())
