"""Cancel notices for running jobs: one pub/sub subscription per worker process.

``cancel.lua`` publishes a job's id on its model's cancel channel after ending
the job; the worker holding it cancels the job's task, which closes the engine
request. A notice lost during a reconnect costs only engine time: the job has
already ended and its later completion is ignored by ``complete.lua``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker.process.backoff import Backoff

log = logging.getLogger(__name__)


class CancelListener:
    def __init__(self, redis: Redis, channels: Mapping[str, str]) -> None:
        self._redis = redis
        self._channels = list(channels)

    async def run(self, on_cancel: Callable[[str], Awaitable[None]]) -> None:
        backoff = Backoff()
        while True:
            pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._channels)
                backoff.reset()
                async for message in pubsub.listen():
                    await on_cancel(message["data"].decode())
            except RedisError as exc:
                log.warning("cancel subscription lost (%s); resubscribing", exc)
                await backoff.wait()
            finally:
                await pubsub.aclose()
