"""Entry points of the long-lived components, each as it runs in production."""

from __future__ import annotations

import asyncio
import logging

from broker import Settings, connect, connect_blocking
from dispatcher.service import Dispatcher
from workers.service import Worker

log = logging.getLogger("fairq")


async def run_dispatcher(settings: Settings, stop: asyncio.Event) -> None:
    redis = connect(settings)
    try:
        dispatcher = Dispatcher(settings, redis)
        log.info(
            "dispatcher %s sharing models: %s",
            dispatcher.name, ", ".join(m.name for m in settings.models),
        )  # fmt: skip
        await dispatcher.run(stop)
    finally:
        await redis.aclose()


async def run_worker(settings: Settings, stop: asyncio.Event, concurrency: int | None) -> None:
    redis = connect(settings)
    blocking = connect_blocking(settings, block_s=1.0)
    try:
        worker = Worker(settings, redis, blocking, concurrency=concurrency)
        log.info(
            "worker %s serving models: %s", worker.name, ", ".join(m.name for m in settings.models)
        )
        await worker.run(stop)
    finally:
        await blocking.aclose()
        await redis.aclose()
