"""The streaming hot path: result-stream entries to Server-Sent Events, bytes as they are.

Each chunk entry already holds complete ``data: {...}\\n\\n`` events as the engine
sent them, so chunks pass through without JSON parsing, logging or Redis calls
of their own. Whatever the reader delivered since the last write goes out as one
body message, so a burst of tokens costs one ``send``. The end event adds an
error event when the job did not complete (see ``outcomes``), then ``[DONE]``.
While nothing arrives (queued, or a slow first token) a comment line at least
every ``HEARTBEAT_S`` keeps proxies from closing an idle connection. One timer
per stream, re-armed twice per period, watches for the lull: a token costs no
timer of its own.

Every event carries an SSE ``id``: ``<result entry id>.<n>``, the n-th event of
that entry (``0-7.2``). A client that lost its connection sends the last id it
saw as ``Last-Event-ID`` to ``GET /v1/jobs/{id}/stream`` and gets exactly the
events after it (``resume_point``): nothing twice, nothing missing, even when
the connection broke in the middle of an entry's events. The ids cost one
split and join per entry, no parsing.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from broker.errors import InvalidRequest
from broker.gateway.errors import JOB_HEADER
from broker.gateway.followed import FollowedJob
from broker.gateway.outcomes import SHUTDOWN, ended_error
from broker.results import ResultEvent

HEARTBEAT_S = 15.0
_KEEPALIVE = b": keep-alive\n\n"
_DONE = b"data: [DONE]\n\n"
_LULL = ResultEvent(b"lull")  # put in a queue by _Heartbeat: nothing came for a while
_EVENT_ID = re.compile(r"^(\d{1,20}-\d{1,20})(?:\.(\d{1,9}))?$")


def resume_point(last_event_id: str | None) -> tuple[bytes, int]:
    """The result entry to resume from and how many of its events the client has seen.

    ``None`` (a first connection) gives (``0-0``, 0): everything.
    """
    if not last_event_id:
        return b"0-0", 0
    match = _EVENT_ID.match(last_event_id.strip())
    if match is None:
        raise InvalidRequest(
            f"Last-Event-ID {last_event_id[:40]!r} is not an event id of this stream "
            "(expected the id of the last event received, like '0-7.2')"
        )
    entry, index = match.groups()
    return entry.encode(), 0 if index is None else int(index) + 1


def _with_ids(entry_id: bytes, events: bytes, skip: int = 0) -> bytes:
    """The entry's events, each with its id; the first ``skip`` left out (seen already)."""
    parts = events.split(b"\n\n")
    parts.pop()  # what follows the last event's blank line: nothing
    prefix = b"id: " + entry_id + b"."
    return b"".join([prefix + b"%d\n" % i + e + b"\n\n" for i, e in enumerate(parts) if i >= skip])


class _Heartbeat:
    """Puts ``_LULL`` in a stream's queue when no event arrived for half a period twice."""

    def __init__(self, queue: asyncio.Queue[ResultEvent]) -> None:
        self.batches = 0  # counted by the stream as it takes events
        self._seen = -1
        self._queue = queue
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(HEARTBEAT_S / 2, self._tick)

    def _tick(self) -> None:
        if self.batches == self._seen and self._queue.empty():
            self._queue.put_nowait(_LULL)
        self._seen = self.batches
        self._handle = self._loop.call_later(HEARTBEAT_S / 2, self._tick)

    def cancel(self) -> None:
        self._handle.cancel()


async def _next_batch(queue: asyncio.Queue[ResultEvent]) -> list[ResultEvent] | None:
    """The events that have arrived (at least one, up to an end event); None on a lull."""
    first = await queue.get()
    if first is _LULL:
        return None
    batch = [first]
    while first.end is None and first is not SHUTDOWN and not queue.empty():
        first = queue.get_nowait()
        batch.append(first)
    return batch


def _end_frame(event: ResultEvent, skip: int = 0) -> bytes:
    error = ended_error(event)
    frame = _DONE if error is None else b"data: " + orjson.dumps(error.to_body()) + b"\n\n" + _DONE
    return frame if event is SHUTDOWN else _with_ids(event.id, frame, skip)


def _frames(batch: list[ResultEvent], job: FollowedJob) -> bytes:
    out = []
    for event in batch:
        skip = 0
        if job.skip and event.id == job.resume_entry:
            skip, job.skip = job.skip, 0
        if event.chunk is not None:
            out.append(_with_ids(event.id, event.chunk, skip))
        elif event.end is not None or event is SHUTDOWN:
            out.append(_end_frame(event, skip))
    return b"".join(out)


async def sse_events(job: FollowedJob) -> AsyncIterator[bytes]:
    heartbeat = _Heartbeat(job.events)
    try:
        while True:
            batch = await _next_batch(job.events)
            heartbeat.batches += 1
            if batch is None:
                yield _KEEPALIVE
                continue
            data = _frames(batch, job)
            last = batch[-1]
            if last.end is not None:
                job.ended = True  # before the write: a client leaving now cancels nothing
                yield data
                return
            if last is SHUTDOWN:
                yield data  # job.ended stays False: release cancels the job
                return
            if data:
                job.delivered = True
                yield data
    finally:
        heartbeat.cancel()


class JobStreamResponse(StreamingResponse):
    """An SSE response that releases its job however the response ends."""

    def __init__(self, job: FollowedJob) -> None:
        headers = {JOB_HEADER: job.id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        self._events = sse_events(job)
        super().__init__(self._events, headers=headers, media_type="text/event-stream")
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Starlette watches for the client's disconnect and cancels the stream; the
        # generator may never have started, so release here rather than in it.
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()  # stops its heartbeat timer even if the send broke off
            await self.job.gateway.finish(self.job.release())
