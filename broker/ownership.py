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
from broker.scripts import Scripts


class OwnershipStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._scripts = Scripts.bind(redis)

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

    async def lease(self, models: Iterable[str], me: str, lease_ms: int, mode: str) -> set[str]:
        """Acquire, renew or release the leases of ``models``; returns those owned after."""
        models = list(models)
        if not models:
            return set()
        async with self._redis.pipeline(transaction=False) as pipe:
            for model in models:
                await self._scripts.lease(
                    keys=[keys.owner(model)], args=[me, lease_ms, mode], client=pipe
                )
            replies = await pipe.execute()
        return {m for m, owned in zip(models, replies, strict=True) if owned}

    async def leave(self, models: Iterable[str], me: str) -> None:
        """Give every lease back and drop the heartbeat (a clean stop: others take over now)."""
        await self.lease(models, me, 1, "release")
        await self._redis.zrem(keys.DISPATCHERS, me)
