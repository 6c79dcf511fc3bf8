"""Each model's demand as a real ``fairq dispatcher`` process exports it on ``/metrics``
(what KEDA scales the engines on): queued by band, in flight, the oldest wait, the
demand in all, and whether an endpoint is ready. One model is served by a real simulator,
the other points where nothing listens (a model whose engines are at zero); real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from broker import JobQueue, RequestKind, StreamMode, Submission
from tests.support import local_http
from tests.support.dispatcher_process import dispatcher_process
from tests.support.eventually import eventually
from tests.support.settings import ENDPOINT, MODEL, make_config, make_settings
from tests.support.stack import sim

COLD = "cold"
MODELS = [{"name": MODEL, "endpoints": [ENDPOINT]}, {"name": COLD, "endpoints": [ENDPOINT]}]


def submission(model: str, user: str, band: str) -> Submission:
    return Submission(
        model=model, owner=user, user=user, tenant=user, band=band,
        kind=RequestKind.CHAT, stream_flag=StreamMode.PLAIN, payload=b"{}",
    )  # fmt: skip


def metric(url: str, name: str, **labels: str) -> float | None:
    """The sample's value on ``url``/metrics; None when the dispatcher does not export it."""
    text = local_http.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


@pytest.fixture
def dispatcher(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """A ``fairq dispatcher`` process for MODEL (a simulator) and COLD (nothing listens),
    no worker; yields the URL its /metrics is served at."""
    with sim() as engine:
        models = [{"name": MODEL, "endpoints": [engine]}, {"name": COLD, "endpoints": [ENDPOINT]}]
        config = make_config(models=models, scrape_interval_s=0.05, status_interval_s=0.1)
        with dispatcher_process(config, redis_url, tmp_path) as url:
            yield url


async def _submit(redis_url: str, jobs: list[tuple[str, str, str]]) -> None:
    redis = Redis.from_url(redis_url)
    try:
        queue = JobQueue(redis, make_settings(redis_url, models=MODELS))
        for model, user, band in jobs:
            await queue.submit(submission(model, user, band))
    finally:
        await redis.aclose()


def test_a_model_at_zero_exports_its_queue_its_oldest_wait_and_no_ready_endpoint(
    dispatcher: str, redis_url: str
) -> None:
    queued = [(COLD, "alice", "default"), (COLD, "alice", "default"), (COLD, "bob", "interactive")]
    asyncio.run(_submit(redis_url, queued))
    submitted = time.monotonic()

    def cold_demand_seen() -> bool:
        return metric(dispatcher, "fairq_model_demand", model=COLD) == 3

    eventually(cold_demand_seen, "the cold model's demand of 3 queued jobs", 10)
    assert metric(dispatcher, "fairq_queue_depth", model=COLD, band="default") == 2
    assert metric(dispatcher, "fairq_queue_depth", model=COLD, band="interactive") == 1
    assert metric(dispatcher, "fairq_model_inflight", model=COLD) == 0
    assert metric(dispatcher, "fairq_model_ready_endpoints", model=COLD) == 0
    time.sleep(0.5)

    def oldest_grows() -> bool:
        age = metric(dispatcher, "fairq_queue_oldest_wait_seconds", model=COLD, band="default")
        return age is not None and 0.5 <= age <= time.monotonic() - submitted + 1

    eventually(oldest_grows, "the default band's oldest wait to pass 0.5 s", 10)
    assert metric(dispatcher, "fairq_queue_oldest_wait_seconds", model=COLD, band="batch") == 0


def test_a_served_model_has_a_ready_endpoint_and_counts_its_jobs_in_flight(
    dispatcher: str, redis_url: str
) -> None:
    def ready() -> bool:
        return metric(dispatcher, "fairq_model_ready_endpoints", model=MODEL) == 1

    eventually(ready, "the simulator's endpoint to be ready", 10)
    # No worker runs: the dispatched job stays in flight, out of the queue.
    asyncio.run(_submit(redis_url, [(MODEL, "alice", "default")]))

    def in_flight() -> bool:
        return metric(dispatcher, "fairq_model_inflight", model=MODEL) == 1

    eventually(in_flight, "the job dispatched and in flight", 10)
    assert metric(dispatcher, "fairq_queue_depth", model=MODEL, band="default") == 0
    assert metric(dispatcher, "fairq_model_demand", model=MODEL) == 1
    assert metric(dispatcher, "fairq_model_ready_endpoints", model=COLD) == 0
