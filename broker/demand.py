"""A model's demand and readiness: what scales its engines, and what a queued job is told.

Engines scale with fairq's queue (``docs/operations.md``, "Scale to zero"): the
dispatcher that owns a model exports its demand (``dispatcher.publisher``) and KEDA reads it.
Two reads live here, beside the keys they touch:

- ``read_oldest_ms``: when the oldest queued job of each band was enqueued. Queue entry
  ids are enqueue times (``XADD *``), so a user's oldest job is the head of their stream;
  the band's oldest is the earliest head among the first ``SCAN_USERS`` users in
  fairness order (bounded whatever the backlog: a user further back whose head is older
  is not seen, and the age reported is then a lower bound).
- ``read_model_state``: whether a model has an engine endpoint that is ready, from its
  dispatcher's status snapshot (``fq:{m}:status``). "starting": the snapshot lists no
  healthy endpoint (none discovered yet, or none answering), so queued jobs wait for an
  engine to start; "ready": at least one is healthy; None: no snapshot (no dispatcher
  owns the model now), nothing known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import keys
from broker.errors import BrokerUnavailable
from broker.redis import replies
from broker.status import SCAN_USERS, entry_ms

ModelState = Literal["ready", "starting"]


async def read_oldest_ms(redis: Redis, model: str, bands: Sequence[str]) -> dict[str, int | None]:
    """Per band, the enqueue time (ms since the epoch) of its oldest queued job seen, or
    None when the band has no backlogged user (two pipelined round trips)."""
    async with redis.pipeline(transaction=False) as pipe:
        for band in bands:
            pipe.zrange(keys.backlog(model, band), 0, SCAN_USERS - 1)
        ranges = [[u.decode() for u in replies.members(r)] for r in await pipe.execute()]
    if not any(ranges):
        return dict.fromkeys(bands)
    async with redis.pipeline(transaction=False) as pipe:
        for band, users in zip(bands, ranges, strict=True):
            for user in users:
                pipe.xrange(keys.queue(model, band, user), count=1)
        heads = iter(await pipe.execute())
    oldest: dict[str, int | None] = {}
    for band, users in zip(bands, ranges, strict=True):
        times = [entry_ms(e[0][0]) for e in (replies.entries(next(heads)) for _ in users) if e]
        oldest[band] = min(times) if times else None
    return oldest


def state_of(snapshot: dict[str, object]) -> ModelState:
    """A published snapshot's model state: "ready" when an endpoint in it is healthy."""
    endpoints = snapshot.get("endpoints")
    rows = endpoints if isinstance(endpoints, list) else []
    ready = any(isinstance(row, dict) and row.get("healthy") is True for row in rows)
    return "ready" if ready else "starting"


async def read_model_state(redis: Redis, model: str) -> ModelState | None:
    """The model's state by its dispatcher's latest snapshot; None without a snapshot."""
    try:
        raw = await redis.get(keys.status(model))
    except RedisError as exc:
        raise BrokerUnavailable(f"could not read the status of model {model!r}: {exc}") from exc
    if not raw:
        return None
    snapshot = orjson.loads(raw)
    if not isinstance(snapshot, dict) or snapshot.get("source") != "dispatcher":
        return None
    return state_of(snapshot)
