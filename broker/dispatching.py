"""The dispatcher's view of Redis: backlog snapshots and the atomic dispatch.

The dispatcher decides *who* goes next (pure policy code in ``dispatcher/``);
this module reads what it decides on and applies the decision with one Lua
script call (``dispatch.lua``), which moves each planned user's head job from
the user's queue to the model's ready stream.

While nothing is queued, the dispatcher also decides ahead of time: ``grant``
lets enqueue.lua send the next few new jobs straight to an endpoint (express),
which is the dispatch it would make for them anyway, without the hop through
the dispatcher process. Every express send and every dispatch bumps a sequence
number that a grant must match, so a grant is never computed from a state that
misses a send.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker import keys
from broker.jobs import StreamMode
from broker.lua.dispatch import Pick, dispatch_call
from broker.lua.grant import grant_call
from broker.lua.park import Parked, park_call
from broker.lua.unseen import Unseen, unseen_call
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
    unstarted: dict[str, int]  # endpoint -> dispatched, no first token yet
    sequence: int = 0  # express sends and dispatches so far ('xs'): a grant must match it
    # Jobs in the engine of the users in ``backlogs``, when asked for (missing: none known)
    in_engine: dict[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.backlogs

    def with_newcomers(self, bands: Sequence[str], newcomers: Sequence[Newcomer]) -> ModelSnapshot:
        """This snapshot plus users that became backlogged since (pure: no Redis)."""
        users = {b.band: dict(b.users) for b in self.backlogs}
        joins = {b.band: b.join for b in self.backlogs}
        for n in newcomers:
            users.setdefault(n.band, {})[n.user] = n.score
            joins.setdefault(n.band, n.score)
        backlogs = [
            BandBacklog(
                band, sorted(users[band].items(), key=lambda us: (us[1], us[0])), joins[band]
            )
            for band in bands
            if users.get(band)
        ]
        return ModelSnapshot(
            backlogs,
            dict(self.inflight),
            dict(self.unstarted),
            self.sequence,
            dict(self.in_engine),
        )


@dataclass(frozen=True)
class Newcomer:
    """A user who just became backlogged in a band, at the band's join score."""

    band: str
    user: str
    score: float


def parse_wake(message: bytes) -> Newcomer | None:
    """A wake message: a newcomer (``n``), or None for any other change (new job of a
    backlogged user ``q``, a job that ended ``e``, an express send ``x``) which a cached
    view does not show."""
    kind, _, rest = message.partition(b"\n")
    if kind != b"n":
        return None
    band, score, user = rest.split(b"\n", 2)
    return Newcomer(band.decode(), user.decode(), float(score))


class ExpressSend(NamedTuple):
    """A job enqueue.lua sent straight to an endpoint (its wake message)."""

    endpoint: str
    plain: bool  # the engine does not stream it (StreamMode.PLAIN)
    newcomer: bool  # its user had nothing in the engine


def express_send(message: bytes) -> ExpressSend | None:
    """An express send's wake message, else None."""
    kind, _, rest = message.partition(b"\n")
    if kind != b"x":
        return None
    endpoint, _, rest = rest.partition(b"\n")
    stream, _, newcomer = rest.partition(b"\n")
    return ExpressSend(endpoint.decode(), stream.decode() == StreamMode.PLAIN, newcomer == b"1")


@dataclass(frozen=True)
class Grant:
    """Express credits: new jobs of each band that may go straight to ``endpoint``."""

    endpoint: str
    credits: dict[str, int]  # band -> jobs; every send takes one from every band
    # Of those, sends of users who already have a job in the engine (free batch slots);
    # every send takes one. None: no such bound (the engine's batch is unknown).
    served: int | None = None


# How long start.lua keeps a start in the handed zset: longer than any engine's metrics
# lag that ``DispatchStore.unseen`` is asked about.
HANDED_KEEP_MS = 1000


# park.lua looks at this many of the newest ready entries for a job to take back: in-flight
# jobs of every endpoint, so a few batches' worth.
PARK_SCAN = 2048


class Dispatched(NamedTuple):
    """What one ``dispatch.lua`` call did."""

    ids: list[str]  # the jobs dispatched, in plan order (emptied queues skipped)
    snapshot: ModelSnapshot  # the model's state right after
    plain: int  # how many of the jobs are not streamed


class DispatchStore:
    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self._settings = settings

    async def ensure_ready_group(self, model: str) -> None:
        """Create the workers' consumer group from the stream's start (idempotent)."""
        await ensure_ready_group(self._redis, model)

    async def snapshot(self, model: str, depth: int, *, in_engine: bool = False) -> ModelSnapshot:
        """The ``depth`` lowest-scored users of every band and the in-flight counts, in one trip
        (two with ``in_engine``: then also the jobs each of those users has in the engine)."""
        bands = self._settings.bands
        async with self._redis.pipeline(transaction=False) as pipe:
            for band in bands:
                pipe.zrange(keys.backlog(model, band), 0, depth - 1, withscores=True)
            fields = [*(keys.join_field(b) for b in bands), keys.GRANT_SEQUENCE]
            pipe.hmget(keys.meta(model), fields)
            pipe.hgetall(keys.inflight(model))
            pipe.hgetall(keys.unstarted(model))
            *ranges, joins, inflight, unstarted = await pipe.execute()
        flat = [[v for user, score in users for v in (user, score)] for users in ranges]
        snap = _state(bands, flat, joins, _flat(inflight), _flat(unstarted))
        users = [u for b in snap.backlogs for u, _ in b.users]
        if not (in_engine and users):
            return snap
        counts = await self._redis.hmget(keys.user_counts(model), users)
        snap.in_engine.update(_in_engine(users, cast(list[bytes | None], counts)))
        return snap

    async def unseen(
        self, models: Sequence[str], endpoint: str, lag_ms: int, start_ms: int = 0
    ) -> Unseen:
        """Jobs of ``models`` that ``endpoint``'s metrics cannot show yet: on their way to
        it (dispatched, no worker has started them), or handed to it within ``lag_ms``
        (at most ``HANDED_KEEP_MS``); and those handed to it streamed within ``start_ms``
        that have no first token yet. Read just before each scrape (``unseen.lua``)."""
        calls = [unseen_call(model, endpoint, lag_ms, start_ms) for model in models]
        async with self._redis.pipeline(transaction=False) as pipe:
            for call in calls:
                call.queue(pipe)
            counts = [c.decode(reply) for c, reply in zip(calls, await pipe.execute(), strict=True)]
        return Unseen(*(sum(column) for column in zip(*counts, strict=True)))

    async def dispatch(
        self,
        model: str,
        endpoint: str,
        cap: int,
        picks: Sequence[Pick],
        depth: int,
        *,
        engine_priority: bool = False,
        rate: float | None = None,
        served_cap: int | None = None,
    ) -> Dispatched:
        """Apply the picks atomically, never taking ``endpoint`` past ``cap`` jobs in flight,
        nor past ``served_cap`` for a user who already has a job in the engine (such a pick
        is skipped and the user keeps their place).

        Returns the job ids dispatched (skipping emptied queues), the model's state right
        after, as ``snapshot(model, depth, in_engine=served_cap is not None)`` would have
        read it, and how many of the jobs are not streamed (admission counts those apart).
        """
        s = self._settings
        call = dispatch_call(
            model,
            endpoint,
            cap=cap,
            picks=picks,
            depth=depth,
            bands=s.bands,
            ready_maxlen=s.ready_stream_maxlen,
            engine_priority=engine_priority,
            rate=rate,
            served_cap=served_cap,
        )
        r = await call.run(self._redis)
        snap = _state(s.bands, r.backlogs, r.meta, r.inflight, r.unstarted)
        for flat, band_counts in zip(r.backlogs, r.in_engine, strict=False):
            users = [u.decode() for u in flat[::2]]
            snap.in_engine.update(_in_engine(users, band_counts))
        return Dispatched(r.ids, snap, r.plain)

    async def park(
        self, model: str, endpoint: str, *, min_jobs: int = 2, young_ms: int = 0
    ) -> Parked | None:
        """Take the newest job without output of the user with the most jobs at ``endpoint``
        (at least ``min_jobs``) back out of the engine, to the head of that user's queue;
        failing that, their oldest streamed job that can go on where it is cut (the model's
        ``resume_streams``; the oldest is nearest its end, so the pause makes no straggler).
        With ``young_ms`` only a job without output handed over within that many ms. Its
        worker is told to drop it. None when no such job is there."""
        config = self._settings.model(model)
        from_text = config is not None and config.resume_streams == "text"
        call = park_call(
            model,
            endpoint,
            scan=PARK_SCAN,
            min_jobs=min_jobs,
            from_text=from_text,
            young_ms=young_ms,
        )
        return await call.run(self._redis)

    async def grant(self, model: str, grant: Grant | None, sequence: int, ttl_ms: int) -> bool:
        """Set the model's express grant (None revokes it); False when refused because the
        state moved past ``sequence`` (an express send or a dispatch since)."""
        g = Grant("", {}) if grant is None else grant
        credits = [(band, g.credits.get(band, 0)) for band in self._settings.bands]
        served = -1 if g.served is None else g.served
        call = grant_call(
            model,
            sequence=sequence,
            ttl_ms=ttl_ms,
            endpoint=g.endpoint,
            served=served,
            credits=credits,
        )
        return await call.run(self._redis)


def _in_engine(users: Sequence[str], counts: Sequence[bytes | None]) -> dict[str, int]:
    return {user: int(count or 0) for user, count in zip(users, counts, strict=True)}


def _flat(mapping: dict[bytes, bytes]) -> list[bytes]:
    return [v for kv in mapping.items() for v in kv]


def _counts(flat: list[bytes]) -> dict[str, int]:
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def _state(
    bands: Sequence[str],
    ranges: list[list[bytes | float]],
    meta_fields: list[bytes | None],
    inflight: list[bytes],
    unstarted: list[bytes],
) -> ModelSnapshot:
    """A snapshot from flat replies: per band [user, score, ...], the joins and the express
    sequence, [endpoint, n, ...]."""
    *joins, sequence = meta_fields
    backlogs = [
        BandBacklog(
            band,
            [(flat[i].decode(), float(flat[i + 1])) for i in range(0, len(flat), 2)],  # type: ignore[union-attr]
            float(join or 0),
        )
        for band, flat, join in zip(bands, ranges, joins, strict=True)
        if flat
    ]
    return ModelSnapshot(backlogs, _counts(inflight), _counts(unstarted), int(sequence or 0))


async def ensure_ready_group(redis: Redis, model: str) -> None:
    try:
        await redis.xgroup_create(keys.ready(model), keys.READY_GROUP, id="0", mkstream=True)
    except ResponseError as exc:  # BUSYGROUP: the group exists already
        if "BUSYGROUP" not in str(exc):
            raise
