"""Coalescing writes of result chunks: one pipeline per flush for every job of a worker.

Tokens arrive far faster than Redis needs to see them. The writer buffers the
chunks of all jobs and flushes them together: one round trip per flush, one
``XADD`` per job per flush holding all its new events. A flush waits at most
``linger_ms`` after the first buffered chunk, except that a job's first chunk
and a job's end are flushed at once (time to first token is never held back).

Order within a job is preserved: its chunks, then its end (``complete.lua``),
which therefore always lands after the last chunk. A failed flush is retried
with backoff, keeping everything buffered: nothing is dropped while Redis is
briefly away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from broker import ExecutionStore, Outcome

log = logging.getLogger(__name__)


@dataclass
class _JobBuffer:
    model: str
    job_id: str
    chunks: list[bytes] = field(default_factory=list)
    body: bytes | None = None
    outcome: Outcome | None = None
    done: asyncio.Future[bool] | None = None


class ResultWriter:
    def __init__(self, store: ExecutionStore, linger_ms: float) -> None:
        self._store = store
        self._linger_s = linger_ms / 1000
        self._pending: dict[str, _JobBuffer] = {}
        self._has_data = asyncio.Event()
        self._urgent = asyncio.Event()
        self.flushes = 0

    def _buffer(self, model: str, job_id: str) -> _JobBuffer:
        buf = self._pending.get(job_id)
        if buf is None:
            buf = self._pending[job_id] = _JobBuffer(model, job_id)
        return buf

    def chunk(self, model: str, job_id: str, data: bytes, *, first: bool = False) -> None:
        """Buffer SSE events of a job; ``first`` flushes without lingering."""
        self._buffer(model, job_id).chunks.append(data)
        self._has_data.set()
        if first:
            self._urgent.set()

    def body(self, model: str, job_id: str, body: bytes) -> None:
        """Buffer the whole response of a non-streamed job."""
        self._buffer(model, job_id).body = body
        self._has_data.set()

    async def finish(self, model: str, job_id: str, outcome: Outcome) -> bool:
        """End the job after its buffered chunks; True if this call ended it (not cancelled)."""
        buf = self._buffer(model, job_id)
        buf.outcome = outcome
        buf.done = asyncio.get_running_loop().create_future()
        self._has_data.set()
        self._urgent.set()
        return await buf.done

    def discard(self, job_id: str) -> None:
        """Drop what a job still has buffered (it was cancelled: nobody reads it)."""
        buf = self._pending.pop(job_id, None)
        if buf is not None and buf.done is not None and not buf.done.done():
            buf.done.set_result(False)

    async def run(self) -> None:
        """Flush forever; cancel the task to stop (call ``drain`` first to flush the rest)."""
        while True:
            await self._has_data.wait()
            if not self._urgent.is_set() and self._linger_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self._linger_s)
            await self._flush_with_retry()

    async def drain(self) -> None:
        if self._pending:
            await self._flush_with_retry()

    async def _flush_with_retry(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._flush()
                return
            except RedisError as exc:
                log.warning("result flush failed (%s); retrying in %.2fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _flush(self) -> None:
        self._has_data.clear()
        self._urgent.clear()
        batch, self._pending = self._pending, {}
        try:
            finished = await self._write(batch.values())
        except BaseException:
            self._requeue(batch)
            raise
        self.flushes += 1
        for buf, ended in finished:
            if buf.done is not None and not buf.done.done():
                buf.done.set_result(ended)

    async def _write(self, buffers: object) -> list[tuple[_JobBuffer, bool]]:
        pipe = self._store.pipeline()
        finishing: list[tuple[_JobBuffer, int]] = []
        for buf in buffers:  # type: ignore[attr-defined]
            if buf.chunks:
                self._store.add_chunk(pipe, buf.model, buf.job_id, b"".join(buf.chunks))
            if buf.body is not None:
                self._store.add_body(pipe, buf.model, buf.job_id, buf.body)
            if buf.outcome is not None:
                await self._store.add_complete(pipe, buf.model, buf.job_id, buf.outcome)
                finishing.append((buf, len(pipe.command_stack) - 1))
        replies = await pipe.execute()
        return [(buf, replies[index] == 1) for buf, index in finishing]

    def _requeue(self, batch: dict[str, _JobBuffer]) -> None:
        """Put a failed batch back in front of what arrived meanwhile, keeping job order."""
        for job_id, newer in self._pending.items():
            old = batch.get(job_id)
            if old is None:
                batch[job_id] = newer
                continue
            old.chunks.extend(newer.chunks)
            old.body = newer.body or old.body
            old.outcome, old.done = newer.outcome or old.outcome, newer.done or old.done
        self._pending = batch
        self._has_data.set()
