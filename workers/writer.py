"""Coalescing writes of result chunks: one pipeline per flush for every job of a worker.

Tokens arrive far faster than Redis needs to see them. The writer buffers the
chunks of all jobs and flushes them together: one round trip per flush, one
``XADD`` per job per flush holding all its new events. While other jobs stream
too, a flush waits at most ``linger_ms`` after the first buffered chunk, so that
their chunks share the write. A job streaming alone is written at once, at the
end of the event loop's pass: nothing would share its write, and the wait would
cost a timer wake-up per token and add up to ``linger_ms`` to each. A job's first
chunk and a job's end do not linger.

The first ``NAP_MAX_S`` of a linger is a nap: the writer blocks the event loop,
then lets it take in everything that arrived. An engine writes a step's tokens to
its streams one after another, over a millisecond or two, and each would wake the
idle worker on its own (~1,400 wake-ups a second at 50 streams, each a system
call and two context switches); asleep, the worker takes them in with one. The
flush goes out when it would have; what the nap holds back, by at most
``NAP_MAX_S``, is whatever else arrives meanwhile: a first chunk or a job's end
(then written at once), a claim, a cancel. Side by side at 50 streams the
worker's CPU per token fell by a tenth while the machine was busy, and did not
move while it was quiet (``docs/performance.md``). The rest of a longer linger is
awaited: an urgent write ends it.

Order within a job is preserved: its chunks, then its end (``complete.lua``),
which therefore always lands after the last chunk. A failed flush is retried,
with backoff, exactly as it was built (same entry ids): Redis refuses an entry
that already landed, so a retry never duplicates a chunk, and nothing buffered
is dropped while Redis is briefly away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from redis.exceptions import NoScriptError, RedisError

from broker import Claimed, ExecutionStore, Outcome, TokenTrail
from broker.process.backoff import Backoff

log = logging.getLogger(__name__)

NAP_MAX_S = 0.002  # the longest the writer blocks the loop in one linger (see above)


class _JobBuffer:
    """What one flush writes for one job (a plain class: one is made per job per flush,
    so about one per token at 50 tokens/s per stream)."""

    __slots__ = (
        "body", "chunks", "done", "entry", "first_ms", "job", "outcome", "started", "trails",
    )  # fmt: skip

    def __init__(self, job: Claimed) -> None:
        self.job = job
        self.chunks: list[bytes] = []
        self.trails: list[TokenTrail] = []  # the token ids of the chunks (a resumable job)
        self.body: bytes | None = None
        self.outcome: Outcome | None = None
        self.done: asyncio.Future[bool] | None = None
        self.entry = b""  # the result entry id this flush writes
        self.started = False  # record that the job has started (first.lua) in this flush
        self.first_ms: int | None = None  # the worker's time of its first output (first.lua)


class ResultWriter:
    def __init__(self, store: ExecutionStore, linger_ms: float) -> None:
        self._store = store
        self._linger_s = linger_ms / 1000
        self._pending: dict[str, _JobBuffer] = {}
        self._seq: dict[str, int] = {}  # job id -> its attempt's last result entry written
        # What ``run`` waits for: anything buffered; something to flush without lingering.
        self._has_data = False
        self._first_at = 0.0  # loop time of the first chunk buffered since the last flush
        self._urgent = False
        self._wake: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # looked up once (getpid on 3.11)
        self.flushes = 0

    def _buffer(self, job: Claimed) -> _JobBuffer:
        buf = self._pending.get(job.job_id)
        if buf is None:
            buf = self._pending[job.job_id] = _JobBuffer(job)
        return buf

    def chunk(
        self,
        job: Claimed,
        data: bytes,
        *,
        first: bool = False,
        first_ms: int | None = None,
        trail: TokenTrail | None = None,
    ) -> None:
        """Buffer SSE events of a job, with their token ids when it records them (``trail``);
        ``first`` flushes without lingering, and so does ``first_ms``: the time of the job's
        first output, its record's first-token time while it runs (``first.lua``)."""
        buf = self._buffer(job)
        buf.chunks.append(data)
        if trail is not None:
            buf.trails.append(trail)
        if first_ms is not None:
            buf.first_ms = first_ms
        self._signal(urgent=first or first_ms is not None)

    def mark_started(self, job: Claimed, first_ms: int | None = None) -> None:
        """Record soon that the job reached the engine (a non-streamed job shows no
        first token until it ends; admission must not count it as waiting that long);
        ``first_ms``: the engine's first token came then (its record shows it)."""
        buf = self._buffer(job)
        buf.started = True
        if first_ms is not None:
            buf.first_ms = first_ms
        self._signal(urgent=True)

    def body(self, job: Claimed, body: bytes) -> None:
        """Buffer the whole response of a non-streamed job."""
        self._buffer(job).body = body
        self._signal(urgent=False)

    async def finish(self, job: Claimed, outcome: Outcome) -> bool:
        """End the job after its buffered chunks; True if this call ended it (not cancelled)."""
        buf = self._buffer(job)
        buf.outcome = outcome
        buf.done = asyncio.get_running_loop().create_future()
        self._signal(urgent=True)
        return await buf.done

    def discard(self, job_id: str) -> None:
        """Drop what a job still has buffered (it was cancelled: nobody reads it)."""
        self._seq.pop(job_id, None)
        buf = self._pending.pop(job_id, None)
        if buf is not None and buf.done is not None and not buf.done.done():
            buf.done.set_result(False)

    def _signal(self, *, urgent: bool) -> None:
        """Wake ``run`` when it waits for data, or, if ``urgent``, while it lingers."""
        self._urgent = self._urgent or urgent
        if not self._has_data:
            self._has_data = True
            self._first_at = self._loop.time() if self._loop is not None else 0.0
        elif not urgent:
            return
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def run(self) -> None:
        """Flush forever; cancel the task to stop (call ``drain`` first to flush the rest)."""
        self._loop = asyncio.get_running_loop()
        while True:
            if not self._has_data:
                await self._sleep(None)
            if not self._urgent and self._linger_s > 0 and self._others_stream():
                await self._linger()
            await self._flush()

    def _others_stream(self) -> bool:
        """More than one job has written output and not ended: a flush may be shared."""
        return len(self._seq) > 1

    async def _linger(self) -> None:
        """Until ``linger_s`` after the first buffered chunk: napping first, then awaiting."""
        assert self._loop is not None
        deadline = self._first_at + self._linger_s
        nap_s = min(deadline - self._loop.time(), NAP_MAX_S)
        if nap_s > 0:
            time.sleep(nap_s)  # blocking on purpose: see the module docstring
            # Two passes of the loop take in what arrived: uvloop reads ready sockets
            # before it resumes this task, asyncio's own loop only in the pass after.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        left_s = deadline - self._loop.time()
        if left_s > 0 and not self._urgent:
            await self._sleep(left_s)

    async def _sleep(self, timeout_s: float | None) -> None:
        """Until ``_signal`` wakes it (see there), or ``timeout_s`` passed."""
        assert self._loop is not None
        wake = self._wake = self._loop.create_future()
        timer = None if timeout_s is None else self._loop.call_later(timeout_s, _end, wake)
        try:
            await wake
        finally:
            self._wake = None
            if timer is not None:
                timer.cancel()

    async def drain(self) -> None:
        if self._pending:
            await self._flush()

    def _take(self) -> list[_JobBuffer]:
        """Everything buffered, each job with the entry id its write will use."""
        self._has_data = self._urgent = False
        batch, self._pending = list(self._pending.values()), {}
        for buf in batch:
            job_id = buf.job.job_id
            if buf.chunks or buf.body is not None:
                first = job_id not in self._seq  # this attempt's first output: it has started
                # A resumed attempt writes after the fence park.lua added: ExecutionStore.entry_id
                seq = self._seq[job_id] = self._seq.get(job_id, 0) + 1
                buf.entry = self._store.entry_id(buf.job, seq)
                buf.started = buf.started or first
            if buf.outcome is not None:
                self._seq.pop(job_id, None)
        return batch

    async def _flush(self) -> None:
        batch = self._take()
        backoff, reload = Backoff(), False
        while True:
            try:
                if reload:
                    await self._store.load_scripts()
                ended = await self._write(batch)
                break
            except NoScriptError:
                reload = True  # Redis restarted and lost its scripts
            except RedisError as exc:
                log.warning("result flush failed (%s); retrying in %.2fs", exc, backoff.delay_s)
                await backoff.wait()
        self.flushes += 1
        for buf, was_ended in ended:
            if buf.done is not None and not buf.done.done():
                buf.done.set_result(was_ended)

    async def _write(self, batch: Sequence[_JobBuffer]) -> list[tuple[_JobBuffer, bool]]:
        pipe = self._store.pipeline()
        finishing: list[tuple[_JobBuffer, int]] = []
        for buf in batch:
            model, job_id = buf.job.model, buf.job.job_id
            if buf.chunks:
                trail = _merged(buf.trails) if buf.trails else None
                self._store.add_chunk(
                    pipe, model, job_id, buf.entry, b"".join(buf.chunks), trail=trail
                )
            elif buf.body is not None:
                self._store.add_body(pipe, model, job_id, buf.entry, buf.body)
            if buf.started:  # it has started: no longer counted as unstarted
                self._store.add_first(pipe, model, job_id, buf.first_ms)
            if buf.outcome is not None:
                self._store.add_complete(pipe, buf.job, buf.outcome)
                finishing.append((buf, len(pipe) - 1))
        replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and not self._store.is_duplicate_write(reply):
                raise reply
        return [(buf, replies[index] == 1) for buf, index in finishing]


def _merged(trails: Sequence[TokenTrail]) -> TokenTrail:
    """The token ids of chunks written as one entry, in order."""
    if len(trails) == 1:
        return trails[0]
    return TokenTrail(
        b";".join(t.tokens for t in trails if t.tokens),
        b"".join(t.prompt_tokens for t in trails),  # only the answer's first chunk has them
        sum(t.redone for t in trails),
    )


def _end(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
