"""Running one job: call the engine, stream its output into Redis, decide the outcome.

The runner owns a job from its ready entry to its ``Outcome``; the writer then
records the outcome after the job's last chunk. Cancellation arrives as
``asyncio.CancelledError`` (the service cancels the task): the ``async with``
around the engine request closes the connection, which aborts the request at
the engine.
"""

from __future__ import annotations

import time

import httpx

from broker import Claimed, JobState, Outcome
from workers.engine import Accounting, complete, stream_events
from workers.errors import EngineError
from workers.writer import ResultWriter


def with_priority(payload: bytes, priority: int | None) -> bytes:
    """The payload with vLLM's ``priority`` field, spliced in as bytes (no JSON rebuild).

    The gateway serialised the payload as a JSON object without ``priority`` (it strips
    any the client sent), so prepending the member keeps it valid JSON.
    """
    if priority is None:
        return payload
    member = b'"priority":%d' % priority
    return b"{" + member + (b"," if payload.strip() != b"{}" else b"") + payload.lstrip()[1:]


class JobRunner:
    def __init__(self, writer: ResultWriter, http: httpx.AsyncClient) -> None:
        self._writer = writer
        self._http = http

    async def run(self, job: Claimed) -> Outcome:
        """Execute the job at its endpoint; engine failures become a failed outcome."""
        accounting = Accounting()
        url = job.endpoint + job.kind.path
        payload = with_priority(job.payload, job.engine_priority)
        try:
            if job.stream:
                first_ms = await self._stream(job, url, payload, accounting)
            else:
                first_ms = await self._plain(job, url, payload, accounting)
        except EngineError as exc:
            return Outcome(JobState.FAILED, error=exc.to_error())
        return Outcome(
            JobState.COMPLETED,
            usage=accounting.usage,
            finish_reason=accounting.finish_reason,
            first_token_ms=first_ms,
        )

    async def _stream(
        self, job: Claimed, url: str, payload: bytes, accounting: Accounting
    ) -> int | None:
        first_ms: int | None = None
        keep_usage = job.stream_flag == "2"
        async for events in stream_events(self._http, url, payload, accounting, keep_usage):
            if first_ms is None:
                first_ms = int(time.time() * 1000)
                self._writer.chunk(job, events, first=True)
            else:
                self._writer.chunk(job, events)
        return first_ms

    async def _plain(self, job: Claimed, url: str, payload: bytes, accounting: Accounting) -> int:
        self._writer.mark_started(job)  # written with the next flush, once the request is out
        body = await complete(self._http, url, payload, accounting)
        self._writer.body(job, body)
        return int(time.time() * 1000)
