"""Wake-ups for the model loops: one pub/sub subscription per process.

The enqueue, complete and cancel scripts publish on ``fq:{m}:wake``; each
message sets the model's event. After a lost connection every event is set
once, so the loops rescan whatever happened meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import keys

log = logging.getLogger(__name__)


class WakeListener:
    def __init__(self, redis: Redis, models: Sequence[str]) -> None:
        self._redis = redis
        self._events = {keys.wake_channel(m).encode(): asyncio.Event() for m in models}
        self._by_model = {m: self._events[keys.wake_channel(m).encode()] for m in models}

    def event(self, model: str) -> asyncio.Event:
        return self._by_model[model]

    async def run(self) -> None:
        backoff = 0.05
        while True:
            try:
                await self._listen()
            except RedisError as exc:
                log.warning("wake subscription lost (%s); resubscribing", exc)
                for event in self._events.values():
                    event.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(*self._events)
            async for message in pubsub.listen():
                event = self._events.get(message["channel"])
                if event is not None:
                    event.set()
        finally:
            await pubsub.aclose()
