"""Where a queued job stands: how many jobs go before it, and about how long it waits.

``jobs_ahead`` is pure arithmetic on plain values; ``QueuePosition.read`` gathers
them from Redis (a status call, not the hot path). Bands are strict, so every
job queued in a higher band goes first; inside the band, fairness interleaves
users: a job that is its user's k-th (0-based) waits for the user's k earlier
jobs and, from every other backlogged user, at most k jobs, or k+1 from the
users whose turn comes before this user's. This is exact for ``round_robin``
as things stand now, and an estimate for ``token_fair`` (whose turns depend on
job sizes) and for jobs that arrive later in higher bands.

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
about to end, and the rate is the safer figure there. The estimate is the later of the
two, but for a user with nothing in the engine the rate alone: such a newcomer takes a
kept batch slot, or preemption makes one, rather than waiting for the batch's next wave
to end (as long as the model keeps slots or preempts, the defaults). Not a count of
recent ends: that is right only with many ends in its window, and long answers end in
waves with long stretches of none.

With no job of fairq's seen in the engine, the engine's own drain stands in, by the rate
alone (the endpoints' ``drain_per_s`` in the dispatcher's status snapshot, from the
engine's metrics: traffic that does not pass through fairq). None only when neither is
known.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker import keys
from broker.jobs import JobRecord
from broker.lua.position import position_call
from broker.redis import replies
from broker.status import entry_ms, latency_of

_MAX_USERS_READ = 1000  # beyond: the estimate counts the first 1000 users of the band
_MAX_OWN_AHEAD = 100_000  # the user's own jobs counted ahead, at most (position.lua)
_RUN_SAMPLE = 50  # ended jobs whose time in the engine makes the mean
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


def wait_s(ahead: int, drain: Drain | None, newcomer: bool = False) -> float | None:
    """Seconds until a job with ``ahead`` jobs before it gets into the engine: the later of
    ``ahead + 1`` ends at the drain's rate and the ``ahead``-th slot to free; for a
    ``newcomer`` (nothing of the user in the engine) the rate alone."""
    if drain is None:
        return None
    by_rate = (ahead + 1) / drain.per_s
    if newcomer or drain.stay_s is None or not drain.remaining_s:
        return round(by_rate, 1)
    rounds, slot = divmod(ahead, len(drain.remaining_s))
    by_slots = drain.remaining_s[slot] + rounds * drain.stay_s
    return round(max(by_rate, by_slots), 1)


@dataclass(frozen=True)
class QueuePosition:
    jobs_ahead: int
    estimated_wait_s: float | None  # None: no drain known (module docstring)

    def public(self) -> dict[str, object]:
        return {"jobs_ahead": self.jobs_ahead, "estimated_wait_s": self.estimated_wait_s}

    @classmethod
    async def read(cls, redis: Redis, job: JobRecord, bands: Sequence[str]) -> QueuePosition:
        m, band = job.model, job.band
        higher = list(bands[: bands.index(band)]) if band in bands else []
        own = position_call(m, job.id, band, job.user, _MAX_OWN_AHEAD)
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.queued_counts(m), higher or ["-"])
            pipe.zrange(keys.backlog(m, band), 0, _MAX_USERS_READ - 1, withscores=True)
            pipe.hvals(keys.inflight(m))
            pipe.xrevrange(keys.latencies(m), count=_RUN_SAMPLE)
            pipe.xpending_range(keys.ready(m), keys.READY_GROUP, "-", "+", _AGES_READ)
            pipe.get(keys.status(m))
            pipe.hget(keys.user_counts(m), job.user)
            # TIME names no key: a cluster pipeline cannot route it, so it goes alongside;
            # so does the script, called on the client, which reloads it after NOSCRIPT.
            results, own_index, now = await asyncio.gather(
                pipe.execute(raise_on_error=False),
                own.run(redis),
                redis.time(),
            )
        counts, users, inflight, ended, pending, status, in_engine = _raised(results)
        turn = {u.decode(): (score, u.decode()) for u, score in users}  # Redis's order
        own_turn = turn.get(job.user, (float("inf"), job.user))
        others = [u for u in turn if u != job.user]
        lengths = dict(zip(others, await _queue_lengths(redis, m, band, others), strict=True))
        ahead = jobs_ahead(
            own_index or 0,  # None: it left the queue meanwhile
            [lengths[u] for u in others if turn[u] < own_turn],
            [lengths[u] for u in others if turn[u] > own_turn],
            sum(int(c or 0) for c in counts),
        )
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        drain = drain_of(
            sum(max(0, int(n)) for n in inflight),
            _recent_runs_ms(replies.entries(ended), now_ms),
            [max(0, now_ms - entry_ms(p["message_id"])) for p in pending],
            _engine_drain(status),
        )
        return cls(ahead, wait_s(ahead, drain, newcomer=int(in_engine or 0) <= 0))


_PENDING = 4  # the pending list's place among the pipeline's replies


def _raised(results: list[object]) -> list[Any]:
    """The pipeline's replies; only the pending list may fail: before any worker made the
    ready group (NOGROUP), no job of the model is in an engine."""
    for i, reply in enumerate(results):
        if isinstance(reply, Exception) and not (
            i == _PENDING and isinstance(reply, ResponseError)
        ):
            raise reply
    return [[] if i == _PENDING and isinstance(r, Exception) else r for i, r in enumerate(results)]


def _recent_runs_ms(ended: list[replies.Entry], now_ms: int) -> list[int]:
    """Time in the engine of the ended jobs of the latency stream, the fresh ones."""
    runs = (
        latency_of(fields).run_ms
        for entry_id, fields in ended
        if now_ms - entry_ms(entry_id) <= _RUN_FRESH_MS
    )
    return [run for run in runs if run is not None]


def _engine_drain(status: bytes | None) -> float | None:
    """The engines' drain in the dispatcher's status snapshot (None: none published, or
    no endpoint's metrics tell it)."""
    if not status:
        return None
    rows = orjson.loads(status).get("endpoints") or []
    drains = [row["drain_per_s"] for row in rows if isinstance(row.get("drain_per_s"), int | float)]
    return sum(drains) if drains else None


async def _queue_lengths(redis: Redis, model: str, band: str, users: list[str]) -> list[int]:
    async with redis.pipeline(transaction=False) as pipe:
        for user in users:
            pipe.xlen(keys.queue(model, band, user))
        return [int(n) for n in await pipe.execute()]
