"""The operator's view of each model: what is queued, for whom, and how the engines are.

The dispatcher owns the engine side (the scraper's view and the admission state live
only in its process), so it publishes a compact JSON snapshot per model into Redis
(``keys.status``, a short TTL, at most every ``status_interval_s``). ``fairq status``,
``fairq top``, the gateway's ``/admin/status`` and its ``/dashboard`` read those
snapshots; for a model without one (no dispatcher running) they read the queues from
Redis themselves and say that the engine side is unknown.

Reading a model's queues costs two pipelined round trips, bounded whatever the
backlog: the queued counts, the backlogged users per band (ZCARD), the jobs in
flight, and the queue length (XLEN) of the first ``SCAN_USERS`` users of each band
in fairness order, of which the ``top`` longest are reported. Users beyond those
are counted but not ranked.

Workers append each ended job's queue wait, time to first token, time in the engine
and newcomer mark to a capped stream per model (``keys.latencies``); the dispatcher
folds them into the snapshot's history and its newcomers' TTFT, so the dashboard can
chart the last minutes, and a queued job's wait estimate reads the time in the engine
(``broker.position``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.typing import EncodableT, FieldT

from broker import keys
from broker.redis import replies
from broker.settings import ModelConfig, Settings

SCAN_USERS = 200  # per band: the users whose queue lengths are read to find the top ones
# The dispatcher's rate is over this window; dispatch.lua stores it (meta 'rate') with when
# ('rate_ms') at each dispatch, so once dispatching stops it is older by as much.
DISPATCH_RATE_WINDOW_S = 30.0


@dataclass(frozen=True)
class BandQueue:
    band: str
    queued: int  # jobs queued in the band
    backlogged_users: int  # users with at least one queued job
    top_users: list[tuple[str, int]]  # (user, jobs queued), longest first


@dataclass(frozen=True)
class ModelQueues:
    model: str
    bands: list[BandQueue]
    inflight: dict[str, int]  # endpoint -> fairq jobs dispatched and not ended
    unstarted: dict[str, int]  # endpoint -> dispatched without a first token yet
    in_engine: list[tuple[str, int]]  # (user, jobs dispatched and not ended), most first
    dispatch_rate: float | None  # jobs/s over the dispatcher's recent window

    def public(self) -> dict[str, object]:
        return {
            "bands": [
                {**asdict(b), "top_users": [{"user": u, "queued": n} for u, n in b.top_users]}
                for b in self.bands
            ],
            "in_engine_users": [{"user": u, "jobs": n} for u, n in self.in_engine],
            "dispatch_rate": self.dispatch_rate,
        }


def _decoded(mapping: dict[bytes, bytes]) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in mapping.items()}


def _top(counts: dict[str, int], n: int) -> list[tuple[str, int]]:
    # nsmallest, not a full sort: the in-engine counts may name every user (py-spy showed
    # the sort of 10,000 users in the dispatcher's status snapshot).
    positive = ((u, c) for u, c in counts.items() if c > 0)
    return heapq.nsmallest(n, positive, key=lambda uc: (-uc[1], uc[0]))


async def read_queues(redis: Redis, model: str, bands: Sequence[str], top: int) -> ModelQueues:
    """The model's queues and counts now (two pipelined round trips, bounded)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.queued_counts(model))
        pipe.hgetall(keys.inflight(model))
        pipe.hgetall(keys.unstarted(model))
        pipe.hgetall(keys.user_counts(model))
        pipe.hmget(keys.meta(model), ["rate", "rate_ms"])
        for band in bands:
            pipe.zcard(keys.backlog(model, band))
            pipe.zrange(keys.backlog(model, band), 0, SCAN_USERS - 1)
        queued, inflight, unstarted, users, (rate, rate_ms), *per_band = await pipe.execute()
    cards, ranges = per_band[0::2], [[u.decode() for u in r] for r in per_band[1::2]]
    lengths = await _queue_lengths(redis, model, bands, ranges) if top else [{} for _ in bands]
    counts = _decoded(queued)
    return ModelQueues(
        model=model,
        bands=[
            BandQueue(band, max(0, counts.get(band, 0)), int(card), _top(length, top))
            for band, card, length in zip(bands, cards, lengths, strict=True)
        ],
        inflight=_decoded(inflight),
        unstarted=_decoded(unstarted),
        in_engine=_top(_decoded(users), top),
        # This host's clock against Redis's (the script's TIME): seconds matter here, not ms.
        dispatch_rate=recent_rate(rate, rate_ms, int(time.time() * 1000)),
    )


def recent_rate(rate: bytes | None, rate_ms: bytes | None, now_ms: int) -> float | None:
    """The dispatch rate over the window that ends now, from the one stored at the last
    dispatch: the jobs of its window that are still in the one ending now (taken as spread
    evenly), none once a whole window passed without a dispatch; None if never measured."""
    if not rate:
        return None
    if not rate_ms:
        return float(rate)
    age_s = max(0.0, (now_ms - int(rate_ms)) / 1000)
    left = max(0.0, 1.0 - age_s / DISPATCH_RATE_WINDOW_S)
    return round(float(rate) * left, 3)


async def _queue_lengths(
    redis: Redis, model: str, bands: Sequence[str], users: list[list[str]]
) -> list[dict[str, int]]:
    async with redis.pipeline(transaction=False) as pipe:
        for band, names in zip(bands, users, strict=True):
            for user in names:
                pipe.xlen(keys.queue(model, band, user))
        replies = iter(await pipe.execute())
    return [{user: int(next(replies)) for user in names} for names in users]


# -- latencies of ended jobs (written by workers, read by the dispatcher) --------------


@dataclass(frozen=True)
class Latency:
    band: str
    wait_ms: int | None  # enqueue -> dispatch
    ttft_ms: int | None  # enqueue -> first token (streamed jobs)
    run_ms: int | None = None  # dispatch -> end: the job's time in the engine (the drain)
    newcomer: bool = False  # dispatched while its user had nothing in the engine ('nw')


def add_latency(pipe: Pipeline, model: str, latency: Latency) -> None:
    """Queue the append of one ended job's latencies (in the caller's pipeline)."""
    fields: dict[FieldT, EncodableT] = {
        "b": latency.band,
        "w": _field(latency.wait_ms),
        "t": _field(latency.ttft_ms),
        "r": _field(latency.run_ms),
    }
    if latency.newcomer:
        fields["n"] = "1"
    pipe.xadd(keys.latencies(model), fields, maxlen=keys.LATENCY_MAXLEN, approximate=True)


def _field(value: int | None) -> str:
    return "" if value is None else str(value)


def _int(value: bytes | None) -> int | None:
    return int(value) if value else None


def latency_of(fields: dict[bytes, bytes]) -> Latency:
    """One entry of the latency stream (entries written before a field existed lack it)."""
    return Latency(
        fields[b"b"].decode(),
        _int(fields.get(b"w")),
        _int(fields.get(b"t")),
        _int(fields.get(b"r")),
        fields.get(b"n") == b"1",
    )


def entry_ms(entry_id: bytes) -> int:
    """When a stream entry was added: the time part of its id."""
    return int(entry_id.partition(b"-")[0])


_FIRST_READ_MS = 60_000


async def read_latencies(
    redis: Redis, model: str, after: bytes | None, count: int = 1000
) -> tuple[list[Latency], bytes | None]:
    """Latencies appended after entry ``after`` and the last id read. None starts with the
    last minute's: a dispatcher that takes a model over (or starts after its jobs ended)
    shows their recent latencies rather than nothing."""
    if after is None:
        last = replies.entries(await redis.xrevrange(keys.latencies(model), count=1))
        if not last:
            return [], b"0-0"
        after = f"{max(0, entry_ms(last[0][0]) - _FIRST_READ_MS)}-0".encode()
    entries = replies.entries(
        await redis.xrange(keys.latencies(model), min=b"(" + after, count=count)
    )
    found = [latency_of(f) for _, f in entries]
    return found, entries[-1][0] if entries else after


# -- the published snapshots ----------------------------------------------------------


@dataclass
class Snapshot:
    """What ``fairq status`` shows for one model; ``source`` says who wrote it."""

    model: str
    at_ms: int
    source: str  # "dispatcher" (published) or "redis" (queues only: no dispatcher seen)
    queues: dict[str, object]
    endpoints: list[dict[str, object]] = field(default_factory=list)
    history: list[list[float | None]] = field(default_factory=list)  # see dispatcher.publisher
    policy: str = ""
    admission: str = ""
    dispatcher: str | None = None
    # TTFT of the recent jobs dispatched to a user with nothing in the engine:
    # {"p50", "p95" (ms; None: no such job), "jobs", "window_s"}; see dispatcher.publisher
    newcomer_ttft: dict[str, object] | None = None

    def public(self) -> dict[str, object]:
        return {
            "model": self.model,
            "at_ms": self.at_ms,
            "source": self.source,
            "dispatcher": self.dispatcher,
            "policy": self.policy,
            "admission": self.admission,
            **self.queues,
            "endpoints": self.endpoints,
            "history": self.history,
            "newcomer_ttft_ms": self.newcomer_ttft,
        }


async def publish_status(redis: Redis, snapshot: Snapshot) -> None:
    await redis.set(
        keys.status(snapshot.model), orjson.dumps(snapshot.public()), ex=keys.STATUS_TTL_S
    )


async def read_status(redis: Redis, settings: Settings, now_ms: int) -> list[dict[str, object]]:
    """Every configured model's latest snapshot, or its queues when none was published."""
    async with redis.pipeline(transaction=False) as pipe:
        for model in settings.models:
            pipe.get(keys.status(model.name))
        published = await pipe.execute()
    views: list[dict[str, object]] = []
    for model, raw in zip(settings.models, published, strict=True):
        if raw:
            views.append(orjson.loads(raw))
            continue
        queues = await read_queues(redis, model.name, settings.bands, settings.status_top_users)
        views.append(_unpublished(model, queues, now_ms).public())
    return views


def _unpublished(model: ModelConfig, queues: ModelQueues, now_ms: int) -> Snapshot:
    endpoints: list[dict[str, object]] = [
        {
            "url": url,
            "inflight": queues.inflight.get(url, 0),
            "unstarted": queues.unstarted.get(url, 0),
            "healthy": None,  # unknown: only a dispatcher scrapes the engines
        }
        # Replicas found through DNS are known to the dispatcher only: show the listed
        # endpoints and those with fairq's jobs in flight.
        for url in dict.fromkeys([*model.endpoints, *queues.inflight])
    ]
    return Snapshot(
        model.name,
        now_ms,
        "redis",
        queues.public(),
        endpoints,
        policy=model.policy,
        admission=model.admission_policy,
    )
