"""Entry points of the long-lived services, each as it runs in production: the one place
that starts the gateway, the dispatcher, the worker and the batch worker. Each service's
modules are imported when it starts, so that one service's start-up loads no other's."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import REGISTRY
from redis.asyncio import Redis

from broker import Settings, connect, connect_blocking, keys, telemetry
from broker.lua import load_scripts
from broker.process import gc_tuning
from fairq import logs

log = logging.getLogger("fairq")


def run_gateway(settings: Settings, host: str, port: int) -> None:
    """Serve the gateway on ``host:port`` until SIGINT or SIGTERM (blocking); it returns
    normally after its graceful shutdown (``gateway.server``)."""
    from gateway import GatewayServer, create_app, gateway_config, make_room

    app = create_app(settings)
    if settings.http.metrics_port is not None:  # else /metrics is on the HTTP port
        telemetry.serve_metrics_at(settings.metrics_host, settings.http.metrics_port)
    make_room(settings.http)
    gc_tuning.settle(settings)
    GatewayServer(gateway_config(app, settings, host, port), app).run()


async def _end_files_kept_forever(settings: Settings) -> None:
    """Files stored before files expired get an end and count against their owner's quota
    (``FileStore.end_files_kept_forever``): once, as a batch worker starts."""
    from broker.batch import FileStore

    redis = connect(settings)
    try:
        ended = await FileStore(redis).end_files_kept_forever(settings.batch.file_keep_s)
    finally:
        await redis.aclose()
    if ended:
        log.info("%d file(s) stored before files expired now expire and count", ended)


def run_batch_worker(settings: Settings) -> None:
    """Run a batch worker until SIGINT or SIGTERM (RQ's warm shutdown: the step finishes)."""
    from redis import Redis as SyncRedis

    from batch import BatchWorker

    telemetry.serve_metrics(settings, "batch worker")  # batch lines and batches ended
    asyncio.run(_end_files_kept_forever(settings))
    worker = BatchWorker(settings, SyncRedis.from_url(settings.require_redis_url()))
    log.info("batch worker %s on queue %s", worker.name, keys.BATCH_QUEUE)
    # RQ's own lines (its registry cleaning twice a second, its scheduler lock) are a
    # library's chatter (fairq.logs); RQ sets its loggers' levels from this argument, and
    # its scheduler, built with the worker, set its own to INFO.
    logs.hold_libraries()
    worker.work(logging_level=logging.getLevelName(logs.library_level(log.getEffectiveLevel())))


async def run_dispatcher(settings: Settings, stop: asyncio.Event) -> None:
    from dispatcher.publisher import DispatcherCollector, StatusPublisher
    from dispatcher.service import Dispatcher

    redis = connect(settings)
    try:
        await _prepare(settings, redis)
        dispatcher = Dispatcher(settings, redis)
        publisher = StatusPublisher(settings, redis, dispatcher)
        REGISTRY.register(DispatcherCollector(publisher))
        telemetry.serve_metrics(settings, "dispatcher")
        log.info(
            "dispatcher %s sharing models: %s",
            dispatcher.name,
            ", ".join(m.name for m in settings.models),
        )
        gc_tuning.settle(settings)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(dispatcher.run(stop))
            tasks.create_task(publisher.run(stop))
    finally:
        await redis.aclose()


async def run_worker(settings: Settings, stop: asyncio.Event, concurrency: int | None) -> None:
    from workers.service import Worker
    from workers.telemetry import WorkerCollector

    redis = connect(settings)
    blocking = connect_blocking(settings, block_s=1.0)
    try:
        await _prepare(settings, redis)
        worker = Worker(settings, redis, blocking, concurrency=concurrency)
        models = [m.name for m in settings.models]
        running = concurrency or settings.worker_concurrency
        REGISTRY.register(WorkerCollector(models, lambda: worker.running, running))
        telemetry.serve_metrics(settings, "worker")
        log.info("worker %s serving models: %s", worker.name, ", ".join(models))
        gc_tuning.settle(settings)
        timings = asyncio.create_task(worker.telemetry.loop(redis))
        try:
            await worker.run(stop)
        finally:
            timings.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timings
        await worker.telemetry.observe(redis)  # the jobs that ended while draining
    finally:
        await blocking.aclose()
        await redis.aclose()


async def _prepare(settings: Settings, redis: Redis) -> None:
    """On a cluster, load the scripts that pipelines call by SHA on every master first
    (``broker.redis.cluster``): a single Redis's pipelines load them on their own."""
    if settings.redis_cluster:
        await load_scripts(redis)
