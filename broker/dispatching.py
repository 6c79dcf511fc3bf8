"""The dispatcher's view of Redis: backlog snapshots and the atomic dispatch.

The dispatcher decides *who* goes next (pure policy code in ``dispatcher/``);
this module reads what it decides on and applies the decision with one Lua
script call (``dispatch.lua``), which moves each planned user's head job from
the user's queue to the model's ready stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker import keys
from broker.scripts import Scripts
from broker.settings import Settings


@dataclass(frozen=True)
class BandBacklog:
    """The lowest-scored backlogged users of one band, in the order Redis keeps them."""

    band: str
    users: list[tuple[str, float]]  # (user, score), ascending score then name
    join: float  # the score a newly backlogged user would get now


@dataclass(frozen=True)
class ModelSnapshot:
    backlogs: list[BandBacklog]  # only bands with backlog, highest priority first
    inflight: dict[str, int]  # endpoint -> dispatched and not yet ended

    @property
    def empty(self) -> bool:
        return not self.backlogs


@dataclass(frozen=True)
class Pick:
    """One planned dispatch: serve ``user``'s head job in ``band``, then rescore."""

    band: str
    user: str
    score_after: float
    join_after: float


class DispatchStore:
    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings
        self._scripts = Scripts.bind(redis)

    async def ensure_ready_group(self, model: str) -> None:
        """Create the workers' consumer group from the stream's start (idempotent)."""
        await ensure_ready_group(self._redis, model)

    async def snapshot(self, model: str, depth: int) -> ModelSnapshot:
        """The ``depth`` lowest-scored users of every band and the in-flight counts, in one trip."""
        bands = self._settings.bands
        async with self._redis.pipeline(transaction=False) as pipe:
            for band in bands:
                pipe.zrange(keys.backlog(model, band), 0, depth - 1, withscores=True)
            pipe.hmget(keys.meta(model), [keys.join_field(b) for b in bands])
            pipe.hgetall(keys.inflight(model))
            replies = await pipe.execute()
        *ranges, joins, inflight = replies
        backlogs = [
            BandBacklog(band, [(u.decode(), float(s)) for u, s in users], float(join or 0))
            for band, users, join in zip(bands, ranges, joins, strict=True)
            if users
        ]
        return ModelSnapshot(backlogs, {ep.decode(): int(n) for ep, n in inflight.items()})

    async def dispatch(self, model: str, endpoint: str, picks: Sequence[Pick]) -> list[str]:
        """Apply the picks atomically; returns the job ids dispatched (skipping empty queues)."""
        if not picks:
            return []
        script_keys = [keys.ready(model), keys.inflight(model), keys.meta(model)]
        args: list[str | float | int] = [
            endpoint,
            keys.job_prefix(model),
            self._settings.ready_stream_maxlen,
        ]
        for p in picks:
            script_keys += [keys.backlog(model, p.band), keys.queue(model, p.band, p.user)]
            args += [p.user, p.score_after, keys.join_field(p.band), p.join_after]
        reply = await self._scripts.dispatch(keys=script_keys, args=args)
        return [job_id.decode() for job_id in reply if job_id]


async def ensure_ready_group(redis: Redis, model: str) -> None:
    try:
        await redis.xgroup_create(keys.ready(model), keys.READY_GROUP, id="0", mkstream=True)
    except ResponseError as exc:  # BUSYGROUP: the group exists already
        if "BUSYGROUP" not in str(exc):
            raise
