"""Model ownership across dispatcher replicas: leases and heartbeats in Redis (I/O).

Each model is owned by one dispatcher at a time through a TTL'd owner key
(``lease.lua``: ``SET NX PX``, renewed by its owner, released on a clean stop).
Live dispatchers keep a heartbeat in one sorted set, so each can tell how many
share the models. Who takes which model is decided in ``dispatcher.ownership``.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from broker import keys
from broker.lua.lease import LeaseMode, lease_call


class OwnershipStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def heartbeat(self, me: str, lease_ms: int) -> int:
        """Say this dispatcher is alive for ``lease_ms``; returns how many are alive."""
        now_s, now_us = await self._redis.time()
        now_ms = now_s * 1000 + now_us // 1000
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.DISPATCHERS, {me: now_ms + lease_ms})
            pipe.zremrangebyscore(keys.DISPATCHERS, "-inf", now_ms)
            pipe.zcard(keys.DISPATCHERS)
            *_, alive = await pipe.execute()
        return int(alive)

    async def lease(
        self, models: Iterable[str], me: str, lease_ms: int, mode: LeaseMode
    ) -> set[str]:
        """Acquire, renew or release the leases of ``models``; returns those owned after."""
        models = list(models)
        if not models:
            return set()
        calls = [lease_call(model, me, lease_ms, mode) for model in models]
        async with self._redis.pipeline(transaction=False) as pipe:
            for call in calls:
                call.queue(pipe)
            replies = await pipe.execute()
        return {m for m, c, r in zip(models, calls, replies, strict=True) if c.decode(r)}

    async def owners(self, models: Iterable[str]) -> dict[str, str | None]:
        """Who holds each model's lease now (None: nobody; it lapsed or was never taken)."""
        models = list(models)
        async with self._redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.get(keys.owner(model))
            replies = await pipe.execute()
        return {
            m: r.decode() if r is not None else None for m, r in zip(models, replies, strict=True)
        }

    async def leave(self, models: Iterable[str], me: str) -> None:
        """Give every lease back and drop the heartbeat (a clean stop: others take over now)."""
        await self.lease(models, me, 1, "release")
        await self._redis.zrem(keys.DISPATCHERS, me)
