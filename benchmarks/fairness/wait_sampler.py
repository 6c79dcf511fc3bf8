"""The wait benchmark's side process: every queued job's position, looked at as it queues.

Run beside a flood as ``python -m benchmarks.fairness.wait_sampler MODEL TICK_S`` with the stack's
environment (``FAIRQ_CONFIG``, ``FAIRQ_REDIS_URL``). Every ``TICK_S`` it finds the model's
job hashes (SCAN: a benchmark's few thousand keys) and reads the ones not yet ended; a job
seen queued in a spell not looked at yet gets its look at once: ``JobQueue.position``, the
call the gateway's GET /v1/jobs/{id} makes (``QueuePosition.read``, in its two halves, so
that what it read is kept beside what it said), with the same "model starting" rule
(``QueuePosition.starting``). It stops when its stdin says so (or closes), reads every job
once more to close the spells, and writes them as JSON to stdout.

A spell is one stay in the queue: the request's own (``taken_back`` 0, from its queue
entry's time, Redis's clock), and one more each time preemption takes the job back out of
the engine (park.lua: ``pk`` counts them; that spell's start is when the sampler first saw
it queued again, at most a tick late). A spell ends at the job's dispatch time (``td``),
read when the job is first seen out of the queue; a spell the sampler never saw queued
(dispatched within a tick) is kept without a look. The clock of the looks is this host's,
which is Redis's here (one machine).

Why a process of its own: the load client reads hundreds of streams on its event loop,
and looks made there would wait behind them (and delay them).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from broker import JobQueue, JobRecord, JobState, connect, job_fields, keys, load_settings
from broker.demand import read_model_state
from broker.position import Observed

READY = b"ready\n"
_LOOKS_AT_ONCE = 32  # concurrent position reads in one tick
_SCAN_COUNT = 1000


@dataclass
class Spell:
    """One stay of one job in the queue, and what its first look said."""

    job_id: str
    user: str
    taken_back: int  # times taken back out of the engine before it (0: the request's own)
    queued_ms: int  # when it entered the queue (a taken-back spell: when first seen queued)
    look_ms: int | None = None  # when the look began (None: no look)
    look_took_ms: int | None = None
    jobs_ahead: int | None = None
    estimate_s: float | None = None
    reason: str | None = None  # why the estimate is None
    left_ms: int | None = None  # dispatched (None: not seen dispatched)
    left: str = "open"  # "dispatched", "ended" (never dispatched from it) or "open"
    observed: dict[str, Any] | None = None  # what the look read (``broker.position``)


@dataclass
class _Job:
    user: str
    next_spell: int = 0  # the ``taken_back`` of the next spell to open
    open: Spell | None = None
    ended: bool = False


class SpellBook:
    """Every job's spells, from what each read of its hash shows (pure: no I/O)."""

    def __init__(self, tick_ms: int) -> None:
        self.jobs: dict[str, _Job] = {}
        self.spells: list[Spell] = []
        self._tick_ms = tick_ms

    def observe(self, job_id: str, h: dict[bytes, bytes], now_ms: int) -> Spell | None:
        """Take one read of the job's hash; returns the spell it opened (to look at)."""
        state = JobState(h[job_fields.STATE].decode())
        taken = int(h.get(job_fields.PARKED) or 0)
        job = self.jobs.get(job_id)
        if job is None:
            job = self.jobs[job_id] = _Job((h.get(job_fields.USER) or b"").decode())
            if state is not JobState.QUEUED:
                self._unseen(job_id, job, h, taken)
        if job.open is not None and (state is not JobState.QUEUED or taken != job.open.taken_back):
            self._close(job.open, h, state)
            job.open = None
        job.ended = state.terminal
        if state is JobState.QUEUED and job.open is None and taken >= job.next_spell:
            queued_ms = _queued_ms(h) if taken == 0 else None
            job.open = Spell(job_id, job.user, taken, queued_ms or now_ms)
            job.next_spell = taken + 1
            self.spells.append(job.open)
            return job.open
        return None

    def unended(self) -> list[str]:
        return [job_id for job_id, job in self.jobs.items() if not job.ended]

    def _unseen(self, job_id: str, job: _Job, h: dict[bytes, bytes], taken: int) -> None:
        """A job first seen out of the queue: its request's spell, never looked at."""
        queued, left = _ms(h.get(job_fields.QUEUED_MS)), _ms(h.get(job_fields.DISPATCHED_MS))
        if taken == 0 and queued is not None and left is not None:
            self.spells.append(Spell(job_id, job.user, 0, queued, left_ms=left, left="dispatched"))
        job.next_spell = taken + 1

    def _close(self, spell: Spell, h: dict[bytes, bytes], state: JobState) -> None:
        """Out of the queue: dispatched (or dispatched and taken back again: ``td`` is this
        spell's), unless it ended from the queue (cancelled, expired), where ``td`` is an
        earlier spell's or missing."""
        dispatched = _ms(h.get(job_fields.DISPATCHED_MS))
        earlier = dispatched is None or dispatched < spell.queued_ms - self._tick_ms
        if state.terminal and earlier:
            spell.left = "ended"
        elif dispatched is not None:
            spell.left_ms, spell.left = dispatched, "dispatched"


def _ms(value: bytes | None) -> int | None:
    return int(value) if value else None


def _queued_ms(h: dict[bytes, bytes]) -> int | None:
    """The queue entry's time ('qe' is ms-seq): when the request was queued."""
    entry = h.get(job_fields.QUEUE_ENTRY)
    return int(entry.partition(b"-")[0]) if entry else None


async def look(
    redis: Redis, job: JobRecord, bands: Sequence[str], spell: Spell, starting: bool
) -> None:
    """Fill in what GET /v1/jobs/{id} would show of the spell's job now (``starting``: the
    model's state as the gateway reads it, once per tick here): ``QueuePosition.read``, in
    its two halves, so that what it read is kept too."""
    spell.look_ms = int(time.time() * 1000)
    observed = await Observed.read(redis, job, bands)
    spell.look_took_ms = int(time.time() * 1000) - spell.look_ms
    position = observed.position()
    if starting:
        position = position.starting()
    spell.jobs_ahead = position.jobs_ahead
    spell.estimate_s = position.estimated_wait_s
    spell.reason = position.estimated_wait_reason
    spell.observed = asdict(observed)


class _Ticks:
    """The sampler's reads of one model, a tick at a time: each tick finds the new jobs
    (SCAN) and those taken back (the parked lists of the users seen); every
    ``_RECHECK_TICKS`` it reads every job not ended, to close the spells of those
    dispatched (their ``td`` stays in the hash, so a late read still tells it). Only the
    fields a record needs are read: a taken-back job's hash also holds its payload."""

    def __init__(self, redis: Redis, bands: Sequence[str], model: str, tick_s: float) -> None:
        self.redis, self.bands, self.model = redis, bands, model
        self.book = SpellBook(int(tick_s * 1000))
        self.seen: list[dict[str, Any]] = []  # per tick: the model's counts and engines
        self._queues: set[tuple[str, str]] = set()  # (band, user) of the jobs seen
        self._ticks = 0

    async def tick(self, last: bool = False) -> None:
        """One tick's reads, then a look at each spell that opened, oldest first."""
        m, book = self.model, self.book
        found = [
            key.decode().removeprefix(keys.job_prefix(m))
            async for key in self.redis.scan_iter(keys.job_pattern(m), count=_SCAN_COUNT)
        ]
        new = [j for j in dict.fromkeys(found) if j not in book.jobs]
        queues = sorted(self._queues)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.status(m))
            pipe.hvals(keys.inflight(m))
            for band, user in queues:
                pipe.lrange(keys.parked(m, band, user), 0, -1)
            status, inflight, *parked = await pipe.execute()
        self.seen.append(_seen(int(time.time() * 1000), status, inflight))
        self._ticks += 1
        if last or self._ticks % _RECHECK_TICKS == 0:
            again = book.unended()
        else:
            again = list(dict.fromkeys(j.decode() for ids in parked for j in ids))
        opened = await self._observe([*new, *(j for j in again if j in book.jobs)])
        if last or not opened:
            return
        starting = await read_model_state(self.redis, m) == "starting"
        gate = asyncio.Semaphore(_LOOKS_AT_ONCE)

        async def one(spell: Spell, job: JobRecord) -> None:
            async with gate:
                await look(self.redis, job, self.bands, spell, starting)

        opened.sort(key=lambda sj: sj[0].queued_ms)
        await asyncio.gather(*(one(spell, job) for spell, job in opened))

    async def _observe(self, ids: list[str]) -> list[tuple[Spell, JobRecord]]:
        """Read the jobs ``ids`` and take each read; the spells that opened, with records."""
        m = self.model
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hmget(keys.job(m, job_id), _FIELDS)
            replies = await pipe.execute()
        now_ms = int(time.time() * 1000)
        opened = []
        for job_id, values in zip(ids, replies, strict=True):
            h = {k: v for k, v in zip(_FIELDS, values, strict=True) if v is not None}
            if not h:
                continue  # expired
            self._queues.add(
                (h.get(job_fields.BAND, b"").decode(), h.get(job_fields.USER, b"").decode())
            )
            if (spell := self.book.observe(job_id, h, now_ms)) is not None:
                opened.append((spell, JobRecord.from_hash(job_id, m, h)))
        return opened


# What a record needs (``JobRecord.from_hash``), and how often the job was taken back.
_FIELDS = (job_fields.STATE, job_fields.USER, job_fields.OWNER, job_fields.BAND,
           job_fields.KIND, job_fields.STREAM, job_fields.TENANT, job_fields.TENANT_FIELD,
           job_fields.QUEUE_ENTRY, job_fields.QUEUED_MS, job_fields.DISPATCHED_MS,
           job_fields.PARKED)  # fmt: skip
_RECHECK_TICKS = 5


def _seen(now_ms: int, status: bytes | None, inflight: list[bytes]) -> dict[str, Any]:
    """What a tick saw of the model as a whole: its jobs in the engines, and the engines
    as its dispatcher's snapshot tells them (for reading a run, not for the figures)."""
    rows = orjson.loads(status).get("endpoints") or [] if status else []
    engines = [{k: row.get(k) for k in _ENGINE_FIELDS} for row in rows]
    return {"t_ms": now_ms, "in_engine": sum(int(n) for n in inflight), "engines": engines}


_ENGINE_FIELDS = ("running", "waiting", "tpot_ms", "drain_per_s")


async def _warm(queue: JobQueue, model: str, band: str) -> None:
    """Open the looks' connections and load their script before the flood, as a gateway
    that has served before would have them."""
    job = JobRecord.from_hash(
        "-", model, {job_fields.STATE: b"queued", job_fields.BAND: band.encode()}
    )
    await asyncio.gather(*(queue.position(job) for _ in range(_LOOKS_AT_ONCE)))


async def sample(model: str, tick_s: float, stop: asyncio.Future[Any]) -> dict[str, Any]:
    """Read and look every tick until ``stop`` is done; then close what ended."""
    settings = load_settings()
    redis = connect(settings)
    ticks = _Ticks(redis, settings.bands, model, tick_s)
    try:
        await _warm(JobQueue(redis, settings), model, settings.bands[-1])
        while not stop.done():
            started = time.perf_counter()
            await ticks.tick()
            left = tick_s - (time.perf_counter() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(stop), max(0.0, left))
        await ticks.tick(last=True)  # the last dispatches: spells left open close
    finally:
        await redis.aclose()
    return {"spells": [asdict(s) for s in ticks.book.spells], "ticks": ticks.seen}


async def _main(model: str, tick_s: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stop = loop.run_in_executor(None, sys.stdin.buffer.readline)
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    return await sample(model, tick_s, stop)


if __name__ == "__main__":
    found = asyncio.run(_main(sys.argv[1], float(sys.argv[2])))
    sys.stdout.buffer.write(orjson.dumps(found))
