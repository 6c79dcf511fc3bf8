"""A cold model's wake-up, the dispatcher's side (issue 22): a job that comes for a model
whose demand was 0 has the model's status published at once, not at the next round; a
model with queued jobs and no healthy endpoint has its DNS records read every
``waking_interval_s`` until a replica is found and healthy, which is scraped and sent
the job at once. Real Redis, a real DNS server on 127.0.0.1 (dnslib), a real simulator;
the dispatcher and the status publisher run in this event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import orjson
import pytest
from redis.asyncio import Redis

from broker import (
    BandQueue,
    JobQueue,
    ModelQueues,
    RequestKind,
    Settings,
    StreamMode,
    Submission,
    keys,
    stop_task,
)
from dispatcher.publisher import ModelStatus, StatusPublisher, publish_at_once
from dispatcher.service import Dispatcher
from tests.support.dns import dns_server
from tests.support.eventually import aeventually
from tests.support.settings import MODEL, make_settings
from tests.support.stack import sim

NAME = "engine-m1.fairq.svc.cluster.local"
LONG_S = 30.0  # the status and DNS periods: nothing in a test may wait for them


def submission(user: str = "alice") -> Submission:
    return Submission(
        model=MODEL, owner=user, user=user, tenant=user, band="default",
        kind=RequestKind.CHAT, stream_flag=StreamMode.PLAIN, payload=b"{}",
    )  # fmt: skip


async def published(redis: Redis) -> dict[str, object] | None:
    raw = await redis.get(keys.status(MODEL))
    return None if raw is None else dict(orjson.loads(raw))


class Running:
    """A dispatcher and its status publisher, running in this loop until ``stop``."""

    def __init__(self, settings: Settings, redis: Redis) -> None:
        self.dispatcher = Dispatcher(settings, redis)
        self.publisher = StatusPublisher(settings, redis, self.dispatcher)
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self.dispatcher.run(self._stop))]

    async def start(self) -> Running:
        """The publisher starts once the dispatcher owns the model, so its first round
        publishes it (a round publishes the models owned then)."""
        await aeventually(lambda: self.dispatcher.owned, "the model's lease", until=bool)
        self._tasks.append(asyncio.create_task(self.publisher.run(self._stop)))
        return self

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            await asyncio.wait_for(asyncio.shield(task), 10)
            await stop_task(task)


def status(queued: int, inflight: int) -> ModelStatus:
    bands = [BandQueue("default", queued, 1 if queued else 0, [])]
    queues = ModelQueues(MODEL, bands, {"http://a:1": inflight} if inflight else {}, {}, [], None)
    return ModelStatus(queues, [])


def test_a_model_is_published_at_once_when_its_published_demand_was_zero() -> None:
    assert status(2, 1).demand == 3
    assert publish_at_once(status(0, 0), None, now=10.0, interval_s=1.0)
    assert publish_at_once(None, None, now=10.0, interval_s=1.0)  # nothing published yet
    assert not publish_at_once(status(1, 0), None, now=10.0, interval_s=1.0)
    assert not publish_at_once(status(0, 1), None, now=10.0, interval_s=1.0)
    # At most once an interval: a model whose jobs end as fast as they come costs no more.
    assert not publish_at_once(status(0, 0), 9.5, now=10.0, interval_s=1.0)
    assert publish_at_once(status(0, 0), 9.0, now=10.0, interval_s=1.0)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_job_for_a_model_without_demand_is_published_at_once_not_at_the_next_round(
    redis_url: str, redis: Redis
) -> None:
    settings = make_settings(redis_url, quick=True, status_interval_s=LONG_S)
    running = Running(settings, redis)
    try:
        await running.start()
        first = await aeventually(lambda: published(redis), "the first round", until=bool)
        assert isinstance(first, dict) and running.publisher.latest[MODEL].demand == 0
        first_at = first["at_ms"]

        def later(s: dict[str, object] | None) -> bool:
            return s is not None and s["at_ms"] != first_at

        queue = JobQueue(redis, settings)
        await queue.submit(submission())
        began = time.monotonic()
        await aeventually(lambda: published(redis), "the demand published at once", 5,
                          until=later, interval_s=0.01)  # fmt: skip
        assert time.monotonic() - began < 2.0  # far from the 30 s round
        assert running.publisher.latest[MODEL].demand == 1
        at_once = await published(redis)
        assert at_once is not None
        # Demand is above 0 now: more jobs wait for the round, as they did before.
        await queue.submit(submission("bob"))
        await asyncio.sleep(0.5)
        assert (await published(redis)) == at_once
        assert running.publisher.latest[MODEL].demand == 1
    finally:
        await running.stop()


async def test_a_waking_model_reads_its_records_often_until_its_replica_serves(
    redis_url: str, redis: Redis
) -> None:
    with dns_server() as (zone, nameserver), sim() as engine:
        port = int(engine.rsplit(":", 1)[1])
        zone.set(NAME, [])  # the Service exists; no pod is ready
        discovery = {"dns": NAME, "port": port, "interval_s": LONG_S,
                     "waking_interval_s": 0.05, "nameservers": [nameserver]}  # fmt: skip
        fields = {"admission": "metrics", "endpoints": [], "discovery": discovery}
        settings = make_settings(redis_url, model_fields=fields, status_interval_s=LONG_S)
        running = Running(settings, redis)
        try:
            await running.start()
            await aeventually(lambda: zone.questions >= 2, "the first read (A and AAAA)")
            await asyncio.sleep(0.3)
            idle = zone.questions
            await asyncio.sleep(0.5)
            assert zone.questions == idle  # no demand: the next read is 30 s away
            await JobQueue(redis, settings).submit(submission())
            await aeventually(lambda: zone.questions >= idle + 10, "reads every 0.05 s", 3)
            zone.set(NAME, ["127.0.0.1"])  # the replica is ready: its record appears
            appeared = time.monotonic()
            await aeventually(lambda: running.dispatcher.dispatched == 1, "the job sent", 5,
                              interval_s=0.01)  # fmt: skip
            assert time.monotonic() - appeared < 2.0  # a read, a scrape, a round
            await asyncio.sleep(0.3)  # the read in flight when it became healthy, if any
            served = zone.questions
            await asyncio.sleep(0.5)
            assert zone.questions == served  # healthy: back to the 30 s period
        finally:
            await running.stop()
