"""Where a queued job stands: how many jobs go before it, and about how long it waits.

``jobs_ahead`` and the wait are pure arithmetic on plain values: ``Observed.read`` gathers
them from Redis (a status call, not the hot path; the engines' side, the same for every job
of the model, as ``Engines``) and ``Observed.position`` makes the position
(``QueuePosition.read`` does both). Bands are strict, so every job queued in a higher band
goes first; inside the band, fairness interleaves users: a job that is its user's k-th
(0-based) waits for the user's k earlier jobs and, from every other backlogged user, at
most k jobs, or k+1 from the users whose turn comes before this user's. This is exact for
``round_robin`` as things stand now, and an estimate for ``token_fair`` (whose turns
depend on job sizes) and for jobs that arrive later in higher bands.

The wait (``wait_s``) comes from the model's drain (``Drain``). fairq measures its own
with what it knows of its jobs in the engine: how many there are (``fq:{m}:inflight``,
exact), how long each has been there (their ready entries' ids are their dispatch times:
the workers' pending list, at most ``_AGES_READ``), and how long a job stays there: the
mean ``te - td`` of the last ``_RUN_SAMPLE`` jobs that ended within ``_RUN_FRESH_MS``
(the workers append it to the latency stream), but at least the mean age of the jobs in
the engine, which have stayed that long and are not done. The ages give a number from a
flood's first second, before anything of it ended, and outweigh the ends of earlier,
shorter jobs; while a flood is young and nothing of it ended, they make a lower bound.

A job with ``k`` jobs ahead gets in when ``k + 1`` jobs have left the engine. By the
rate, that is ``(k + 1) / per_s`` (Little's law: ``per_s`` = jobs in the engine / stay);
by the slots, each job in the engine frees its slot after what is left of its stay, and
then once per stay again: the ``k``-th slot to free (0-based) is the ``k mod n``-th
soonest of ``n`` remainders plus ``k div n`` stays. Answers that started together end
together, in waves, which the rate averages away (22 s where a job needs the ends of the
next two waves: 34 s); a stay that varies much leaves old jobs that the slots count as
about to end, and the rate is the safer figure there.

Both read the engine as if its batch were full and its jobs now were all it runs. While a
flood fills it, it takes jobs in only as fast as it prefills them (and fairq's backpressure
sends them no faster); Little's law on the young jobs' ages then says twice that rate (they
came in one after another: their mean age is half the oldest's), and the wait half of what
it turns out to be. When admission held jobs back a moment, the few left in the engine say
a rate far too low. Hence a third figure, the queue's own drain while the job waited
(``queue_rate``): the jobs dispatched since it was queued (those in the engine younger than
its wait, and the ended ones of the latency stream's last ``_ENDS_READ`` whose ``te - run``
falls after it, no further back than those reach), over its wait; ``k + 1`` dispatches at
that rate. A job that waited proves the queue was backlogged all that time, so the rate is
what the engine took in, whatever held it back. Not from fewer than ``_MIN_DISPATCHES``
dispatches: a job queued a moment ago has seen none (its first look gets the engine's
figures), and one queued behind a full batch of long answers may have seen only a
newcomer or two let in, which say nothing of the rate the batch's ends free it at.

With room in the batch, the queue's figure alone where it is known (else the later of the
engine's two): jobs get in as fast as the engine starts them and admission lets them,
which it measured. With the batch full (each endpoint's batch as the dispatcher's status
snapshot gives it, less its kept slots, filled by fairq's jobs in the engines; an endpoint
whose batch is not known, never seen full, has room), a job gets in only as others leave,
and the estimate is the latest of the three. A user with nothing in the engine gets the
engine's rate alone: such a newcomer takes a kept batch slot, or preemption makes one,
rather than waiting for the batch's next wave to end or the others' dispatches (as long
as the model keeps slots or preempts, the defaults). Not a count of recent ends: that is
right only with many ends in its window, and long answers end in waves with long
stretches of none. How close it comes to the wait that followed in the seed and mixed
floods: ``benchmarks.fairness.wait_estimate``, its figures in docs/performance.md.

With no job of fairq's seen in the engine, the engine's own drain stands in, by the rate
alone (the endpoints' ``drain_per_s`` in the dispatcher's status snapshot, from the
engine's metrics: traffic that does not pass through fairq). With neither, and nothing
dispatched while the job waited, there is no figure: ``estimated_wait_s`` is None and
``estimated_wait_reason`` says why (``NO_DRAIN``; while the model is starting,
``STARTING``: the gateway's rule, ``gateway.jobs``).

The dashboard shows per model and band what a job queued now would be told
(``band_waits``), made by the same rule from a job that is not there yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from broker import keys
from broker.demand import read_oldest_ms
from broker.jobs import JobRecord
from broker.lua.position import position_call
from broker.redis import replies
from broker.status import entry_ms, latency_of

_MAX_USERS_READ = 1000  # beyond: the estimate counts the first 1000 users of the band
_MAX_OWN_AHEAD = 100_000  # the user's own jobs counted ahead, at most (position.lua)
_RUN_SAMPLE = 50  # ended jobs whose time in the engine makes the mean
_ENDS_READ = 200  # ended jobs read to count the dispatches while a job waited (the newest)
_MIN_DISPATCHES = 4  # fewer say little of a rate: a newcomer or two let into a full batch
_RUN_FRESH_MS = 600_000  # older ends say little about the engine now
_AGES_READ = 256  # jobs in the engine whose age is read (the oldest; the rest: just started)
_MIN_STAY_S = 0.001  # jobs that ended at once (refused by the engine): not an endless drain


def jobs_ahead(
    own_index: int, ahead_of_us: Sequence[int], behind_us: Sequence[int], higher_bands: int
) -> int:
    """Jobs dispatched before a user's ``own_index``-th job.

    ``ahead_of_us``/``behind_us``: queue lengths of the other backlogged users whose
    turn comes before/after this user's.
    """
    first = sum(min(length, own_index + 1) for length in ahead_of_us)
    later = sum(min(length, own_index) for length in behind_us)
    return higher_bands + own_index + first + later


@dataclass(frozen=True)
class Drain:
    """How fast jobs leave the model's engines (module docstring)."""

    per_s: float  # jobs ended per second
    stay_s: float | None = None  # a job's time in the engine; None: only the rate is known
    remaining_s: tuple[float, ...] = ()  # what is left of each job's stay there, soonest first


def drain_of(
    in_engine: int, run_ms: Sequence[int], ages_ms: Sequence[int], engine_per_s: float | None
) -> Drain | None:
    """The drain from fairq's ``in_engine`` jobs, the stays ``run_ms`` of recently ended
    ones and the ages ``ages_ms`` of those in the engine (oldest first; the others count as
    just started); else from the engines' own figure; None when neither is known."""
    slots = max(in_engine, len(ages_ms))
    stay_s = max(_mean(run_ms), _mean(ages_ms)) / 1000
    if slots > 0 and stay_s > 0:
        stay_s = max(stay_s, _MIN_STAY_S)
        ages_s = [age / 1000 for age in ages_ms] + [0.0] * (slots - len(ages_ms))
        remaining = sorted(max(0.0, stay_s - age) for age in ages_s)
        return Drain(slots / stay_s, stay_s, tuple(remaining))
    if engine_per_s is not None and engine_per_s > 0:
        return Drain(engine_per_s)
    return None


def _mean(values: Sequence[int]) -> float:
    return sum(values) / len(values) if values else 0.0


def queue_rate(
    waited_ms: int,
    in_engine: int,
    ages_ms: Sequence[int],
    ended: Sequence[tuple[int, int]],
    ends_cover_ms: int | None = None,
) -> float | None:
    """Jobs dispatched per second while a job has waited ``waited_ms``: of fairq's
    ``in_engine`` jobs, those of ``ages_ms`` below the wait (the others, not read, count as
    just started), and the ``ended`` ones, (ms since it ended, its run_ms), dispatched since
    then. ``ends_cover_ms``: how far back the ends read tell every end (None: all of them),
    and so the window at most. None when fewer than ``_MIN_DISPATCHES`` went in the window."""
    window = waited_ms if ends_cover_ms is None else min(waited_ms, ends_cover_ms)
    if window <= 0:
        return None
    unread = max(0, in_engine - len(ages_ms))
    dispatched = unread + sum(age <= window for age in ages_ms)
    dispatched += sum(since + run <= window for since, run in ended)
    return dispatched / (window / 1000) if dispatched >= _MIN_DISPATCHES else None


def wait_s(
    ahead: int,
    drain: Drain | None,
    newcomer: bool = False,
    queue_per_s: float | None = None,
    batch_full: bool = True,
) -> float | None:
    """Seconds until a job with ``ahead`` jobs before it gets into the engine.

    With the ``batch_full`` (or where the queue's drain is not known), the latest of
    ``ahead + 1`` ends at the drain's rate, the ``ahead``-th slot to free and ``ahead + 1``
    dispatches at the rate the queue drained while the job waited (``queue_per_s``); with
    room in the batch, that last alone. For a ``newcomer`` (nothing of the user in the
    engine) the drain's rate alone, where it is known."""
    if newcomer and drain is not None:
        return round((ahead + 1) / drain.per_s, 1)
    by_queue = None if queue_per_s is None else (ahead + 1) / queue_per_s
    if by_queue is not None and not batch_full:
        return round(by_queue, 1)
    waits = [] if by_queue is None else [by_queue]
    if drain is not None:
        waits.append((ahead + 1) / drain.per_s)
    if drain is not None and drain.stay_s is not None and drain.remaining_s:
        rounds, slot = divmod(ahead, len(drain.remaining_s))
        waits.append(drain.remaining_s[slot] + rounds * drain.stay_s)
    return round(max(waits), 1) if waits else None


NO_DRAIN = (
    "no drain to go by: no job of the model is in an engine or ended in the last "
    f"{_RUN_FRESH_MS // 60_000} minutes, and no engine's metrics tell one"
)
STARTING = "the model is starting: the wait is its engine's start-up, not the queue's drain"


@dataclass(frozen=True)
class QueuePosition:
    jobs_ahead: int
    estimated_wait_s: float | None  # None: not known, and ``estimated_wait_reason`` says why
    estimated_wait_reason: str | None = None

    def public(self) -> dict[str, object]:
        return {
            "jobs_ahead": self.jobs_ahead,
            "estimated_wait_s": self.estimated_wait_s,
            "estimated_wait_reason": self.estimated_wait_reason,
        }

    def starting(self) -> QueuePosition:
        """As shown while the model has no ready engine (``broker.demand``)."""
        return replace(self, estimated_wait_s=None, estimated_wait_reason=STARTING)

    @classmethod
    async def read(cls, redis: Redis, job: JobRecord, bands: Sequence[str]) -> QueuePosition:
        return (await Observed.read(redis, job, bands)).position()


@dataclass(frozen=True)
class Engines:
    """What fairq sees of a model's engines, as read from Redis: plain values, the same for
    every job of the model (``wait_s`` is pure)."""

    in_engine: int  # fairq's jobs of the model in its engines
    ended: tuple[tuple[int, int], ...] = ()  # fresh ends, newest first: (ms since, run_ms)
    ages_ms: tuple[int, ...] = ()  # of the jobs in the engines (the oldest, oldest first)
    engine_per_s: float | None = None  # the engines' own drain (the dispatcher's snapshot)
    ends_cover_ms: int | None = None  # how far back ``ended`` tells every end (None: all)
    batch_open: int | None = None  # slots open to users in the engines (None: not known)

    def wait_s(self, ahead: int, newcomer: bool, waited_ms: int) -> float | None:
        """The wait of a job with ``ahead`` before it that has waited ``waited_ms``."""
        runs = [run for _, run in self.ended[:_RUN_SAMPLE]]
        drain = drain_of(self.in_engine, runs, self.ages_ms, self.engine_per_s)
        rate = queue_rate(waited_ms, self.in_engine, self.ages_ms, self.ended, self.ends_cover_ms)
        full = self.batch_open is not None and self.in_engine >= self.batch_open
        return wait_s(ahead, drain, newcomer, queue_per_s=rate, batch_full=full)

    @staticmethod
    def queue_reads(pipe: Pipeline, model: str) -> None:
        """Add the four reads ``of`` takes to a pipeline, first (``_raised``)."""
        pipe.hvals(keys.inflight(model))
        pipe.xrevrange(keys.latencies(model), count=_ENDS_READ)
        pipe.xpending_range(keys.ready(model), keys.READY_GROUP, "-", "+", _AGES_READ)
        pipe.get(keys.status(model))

    @classmethod
    def of(cls, read: Sequence[Any], now_ms: int) -> Engines:
        """From the replies of ``queue_reads``, read at ``now_ms`` (Redis's clock)."""
        inflight, ended, pending, status = read
        ends = replies.entries(ended)
        engine_per_s, batch_open = _engines(status)
        return cls(
            sum(max(0, int(n)) for n in inflight),
            _recent_runs(ends, now_ms),
            tuple(max(0, now_ms - entry_ms(p["message_id"])) for p in pending),
            engine_per_s,
            _ends_cover_ms(ends, now_ms),
            batch_open,
        )


@dataclass(frozen=True)
class Observed:
    """What a position is made of, as read from Redis: plain values (``position`` is pure)."""

    own_index: int  # the user's jobs ahead of this one in its queue
    ahead_of_us: tuple[int, ...]  # queue lengths of the users whose turn comes first
    behind_us: tuple[int, ...]  # ... and after
    higher_bands: int  # jobs queued in more urgent bands
    engines: Engines
    newcomer: bool  # the user has nothing in the engines
    waited_ms: int = 0  # in the queue so far (a job taken back: since its last dispatch)

    def position(self) -> QueuePosition:
        ahead = jobs_ahead(self.own_index, self.ahead_of_us, self.behind_us, self.higher_bands)
        wait = self.engines.wait_s(ahead, self.newcomer, self.waited_ms)
        return QueuePosition(ahead, wait, NO_DRAIN if wait is None else None)

    @classmethod
    async def read(cls, redis: Redis, job: JobRecord, bands: Sequence[str]) -> Observed:
        m, band = job.model, job.band
        higher = list(bands[: bands.index(band)]) if band in bands else []
        own = position_call(m, job.id, band, job.user, _MAX_OWN_AHEAD)
        async with redis.pipeline(transaction=False) as pipe:
            Engines.queue_reads(pipe, m)
            pipe.hmget(keys.queued_counts(m), higher or ["-"])
            pipe.zrange(keys.backlog(m, band), 0, _MAX_USERS_READ - 1, withscores=True)
            pipe.hget(keys.user_counts(m), job.user)
            # TIME names no key: a cluster pipeline cannot route it, so it goes alongside;
            # so does the script, called on the client, which reloads it after NOSCRIPT.
            results, own_index, now = await asyncio.gather(
                pipe.execute(raise_on_error=False),
                own.run(redis),
                redis.time(),
            )
        read = _raised(results)
        counts, users, in_engine = read[_ENGINE_READS:]
        turn = {u.decode(): (score, u.decode()) for u, score in users}  # Redis's order
        own_turn = turn.get(job.user, (float("inf"), job.user))
        others = [u for u in turn if u != job.user]
        lengths = dict(zip(others, await _queue_lengths(redis, m, band, others), strict=True))
        now_ms = _ms(now)
        since = max(job.enqueued_ms or now_ms, job.dispatched_ms or 0)
        return cls(
            own_index or 0,  # None: it left the queue meanwhile
            tuple(lengths[u] for u in others if turn[u] < own_turn),
            tuple(lengths[u] for u in others if turn[u] > own_turn),
            sum(int(c or 0) for c in counts),
            Engines.of(read[:_ENGINE_READS], now_ms),
            int(in_engine or 0) <= 0,
            max(0, now_ms - since),
        )


@dataclass(frozen=True)
class BandWait:
    """What a job queued now in ``band`` would be told (the dashboard's wait per model)."""

    band: str
    new_user: QueuePosition  # from a user with nothing queued or in the engines
    back: QueuePosition  # behind every job queued in the band and above

    def public(self) -> dict[str, object]:
        return {"band": self.band, "new_user": self.new_user.public(), "back": self.back.public()}

    def starting(self) -> BandWait:
        return replace(self, new_user=self.new_user.starting(), back=self.back.starting())


def band_waits(
    bands: Sequence[str],
    queued: Mapping[str, int],
    backlogged: Mapping[str, int],
    oldest_age_ms: Mapping[str, int],
    engines: Engines,
) -> list[BandWait]:
    """Per band, the position of a job queued now by a new user and at the back.

    The two bound what any job queued now in the band is told: a new user's turn comes
    after one job of each backlogged user, and it waits by the drain's rate (a kept slot:
    module docstring); no job waits behind more than every job queued in the band and
    above (as things stand: later arrivals in higher bands go first). A job queued now has
    waited nothing, but the band's oldest queued job (``oldest_age_ms``) proves the queue
    backlogged that long, which is what a queued job's own wait proves (``queue_rate``).
    """
    waits, higher = [], 0
    for band in bands:
        waited = oldest_age_ms.get(band, 0)
        users = (1,) * min(backlogged.get(band, 0), _MAX_USERS_READ)
        new_user = Observed(0, users, (), higher, engines, True, waited)
        back = Observed(queued.get(band, 0), (), (), higher, engines, False, waited)
        waits.append(BandWait(band, new_user.position(), back.position()))
        higher += queued.get(band, 0)
    return waits


async def read_band_waits(redis: Redis, model: str, bands: Sequence[str]) -> list[BandWait]:
    """``band_waits`` from Redis now: the position's engine reads, the queued counts, the
    backlogged users and each band's oldest job (``broker.demand``; a few round trips,
    bounded whatever the backlog)."""
    async with redis.pipeline(transaction=False) as pipe:
        Engines.queue_reads(pipe, model)
        pipe.hgetall(keys.queued_counts(model))
        for band in bands:
            pipe.zcard(keys.backlog(model, band))
        results, oldest, now = await asyncio.gather(
            pipe.execute(raise_on_error=False), read_oldest_ms(redis, model, bands), redis.time()
        )
    read = _raised(results)
    counts, *cards = read[_ENGINE_READS:]
    now_ms = _ms(now)
    return band_waits(
        bands,
        {k.decode(): max(0, int(v)) for k, v in counts.items()},
        {band: int(card) for band, card in zip(bands, cards, strict=True)},
        {band: now_ms - at for band, at in oldest.items() if at is not None},
        Engines.of(read[:_ENGINE_READS], now_ms),
    )


_ENGINE_READS = 4  # the replies of ``Engines.queue_reads``, first in a pipeline
_PENDING = 2  # the pending list's place among them


def _raised(results: list[object]) -> list[Any]:
    """The pipeline's replies; only the pending list may fail: before any worker made the
    ready group (NOGROUP), no job of the model is in an engine."""
    for i, reply in enumerate(results):
        if isinstance(reply, Exception) and not (
            i == _PENDING and isinstance(reply, ResponseError)
        ):
            raise reply
    return [[] if i == _PENDING and isinstance(r, Exception) else r for i, r in enumerate(results)]


def _ms(time_reply: tuple[int, int]) -> int:
    """Redis's TIME as ms since the epoch."""
    return int(time_reply[0]) * 1000 + int(time_reply[1]) // 1000


def _recent_runs(ended: list[replies.Entry], now_ms: int) -> tuple[tuple[int, int], ...]:
    """(ms since it ended, time in the engine) of the ended jobs of the latency stream,
    the fresh ones."""
    runs = ((now_ms - entry_ms(entry_id), latency_of(fields).run_ms) for entry_id, fields in ended)
    return tuple((since, run) for since, run in runs if since <= _RUN_FRESH_MS and run is not None)


def _ends_cover_ms(ended: list[replies.Entry], now_ms: int) -> int:
    """How far back the ends read tell every end: to the oldest read when the read was
    cut at ``_ENDS_READ``, else as far as they count as fresh (``_recent_runs``)."""
    if len(ended) < _ENDS_READ:
        return _RUN_FRESH_MS
    return min(_RUN_FRESH_MS, now_ms - entry_ms(ended[-1][0]))


def _engines(status: bytes | None) -> tuple[float | None, int | None]:
    """From the dispatcher's status snapshot: the engines' drain (None: none published, or
    no endpoint's metrics tell it), and the batch slots open to users with jobs in the
    engines, each endpoint's batch less its kept slots (None: not published, or an
    endpoint's batch is not known)."""
    if not status:
        return None, None
    rows = orjson.loads(status).get("endpoints") or []
    drains = [row["drain_per_s"] for row in rows if isinstance(row.get("drain_per_s"), int | float)]
    batches = [(row.get("batch_slots"), row.get("kept_slots") or 0) for row in rows]
    known = bool(rows) and all(isinstance(batch, int) for batch, _ in batches)
    open_slots = sum(batch - kept for batch, kept in batches) if known else None
    return (sum(drains) if drains else None), open_slots


async def _queue_lengths(redis: Redis, model: str, band: str, users: list[str]) -> list[int]:
    async with redis.pipeline(transaction=False) as pipe:
        for user in users:
            pipe.xlen(keys.queue(model, band, user))
        return [int(n) for n in await pipe.execute()]
