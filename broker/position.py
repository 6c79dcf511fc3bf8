"""Where a queued job stands: how many jobs go before it, and about how long it waits.

``jobs_ahead`` is pure arithmetic on plain values; ``QueuePosition.read`` gathers
them from Redis (a status call, not the hot path). Bands are strict, so every
job queued in a higher band goes first; inside the band, fairness interleaves
users: a job that is its user's k-th (0-based) waits for the user's k earlier
jobs and, from every other backlogged user, at most k jobs, or k+1 from the
users whose turn comes before this user's. This is exact for ``round_robin``
as things stand now, and an estimate for ``token_fair`` (whose turns depend on
job sizes) and for jobs that arrive later in higher bands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from broker import keys
from broker.jobs import JobRecord

_MAX_USERS_READ = 1000  # beyond: the estimate counts the first 1000 users of the band
_RATE_FRESH_MS = 60_000


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
class QueuePosition:
    jobs_ahead: int
    estimated_wait_s: float | None  # None: no recent dispatch rate to go by

    def public(self) -> dict[str, object]:
        return {"jobs_ahead": self.jobs_ahead, "estimated_wait_s": self.estimated_wait_s}

    @classmethod
    async def read(cls, redis: Redis, job: JobRecord, bands: Sequence[str]) -> QueuePosition:
        m, band = job.model, job.band
        higher = list(bands[: bands.index(band)]) if band in bands else []
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hmget(keys.queued_counts(m), higher or ["-"])
            pipe.xrange(keys.queue(m, band, job.user), "-", "+", count=100_000)
            pipe.zrange(keys.backlog(m, band), 0, _MAX_USERS_READ - 1, withscores=True)
            pipe.hmget(keys.meta(m), ["rate", "rate_ms"])
            # TIME names no key: a cluster pipeline cannot route it, so it goes alongside.
            (counts, own_queue, users, rate), now = await asyncio.gather(
                pipe.execute(), redis.time()
            )
        turn = {u.decode(): (score, u.decode()) for u, score in users}  # Redis's order
        own_turn = turn.get(job.user, (float("inf"), job.user))
        others = [u for u in turn if u != job.user]
        lengths = dict(zip(others, await _queue_lengths(redis, m, band, others), strict=True))
        ahead = jobs_ahead(
            _index_of(own_queue, job.id),
            [lengths[u] for u in others if turn[u] < own_turn],
            [lengths[u] for u in others if turn[u] > own_turn],
            sum(int(c or 0) for c in counts),
        )
        return cls(ahead, _wait_s(ahead, rate, now))


def _wait_s(ahead: int, rate: list[bytes | None], now: tuple[int, int]) -> float | None:
    """``ahead`` over the dispatcher's recent rate, if it reported one recently."""
    per_s, at_ms = rate
    now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
    if not per_s or not at_ms or now_ms - int(at_ms) > _RATE_FRESH_MS or float(per_s) <= 0:
        return None
    return round(ahead / float(per_s), 1)


def _index_of(entries: list[tuple[bytes, dict[bytes, bytes]]], job_id: str) -> int:
    wanted = job_id.encode()
    return next((i for i, (_, f) in enumerate(entries) if f.get(b"j") == wanted), 0)


async def _queue_lengths(redis: Redis, model: str, band: str, users: list[str]) -> list[int]:
    async with redis.pipeline(transaction=False) as pipe:
        for user in users:
            pipe.xlen(keys.queue(model, band, user))
        return [int(n) for n in await pipe.execute()]
