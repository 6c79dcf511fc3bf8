"""``GET /v1/jobs/{id}`` says whether a queued job's model can serve it: "starting" while
the model has no ready engine endpoint (its wait estimate then null), "ready" when it
has one, null before any dispatcher published the model's status. A real gateway and a
real ``fairq dispatcher`` process over a real Redis; one model's endpoint is a real
simulator, the other's is a port where nothing listens (a model at zero)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import JobQueue, Latency, RequestKind, Settings, StreamMode, Submission, keys
from broker.position import STARTING
from broker.status import add_latency
from tests.support import local_http
from tests.support.dispatcher_process import dispatcher_process
from tests.support.eventually import eventually
from tests.support.settings import ALICE, ENDPOINT, MODEL, make_config, make_settings
from tests.support.stack import gateway, sim

COLD = "cold"


def _config(engine: str) -> dict[str, Any]:
    # MODEL admits one job at a time (no worker runs it), so a second one stays queued.
    models = [
        {"name": MODEL, "endpoints": [engine], "admission": "static", "inflight_cap": 1},
        {"name": COLD, "endpoints": [ENDPOINT]},
    ]
    return make_config(models=models, scrape_interval_s=0.05, status_interval_s=0.1)


@pytest.fixture
def stack(redis_url: str) -> Iterator[tuple[Settings, str, str]]:
    """(settings, the gateway's URL, the simulator's URL); no dispatcher yet."""
    with sim() as engine:
        settings = make_settings(redis_url, **_config(engine), metrics_port=0)
        with gateway(settings) as url:
            yield settings, url, engine


async def _submit(settings: Settings, model: str, n: int = 1) -> list[str]:
    redis = Redis.from_url(settings.require_redis_url())
    try:
        queue = JobQueue(redis, settings)
        submission = Submission(
            model=model, owner="alice", user="alice", tenant="alice", band="default",
            kind=RequestKind.CHAT, stream_flag=StreamMode.PLAIN, payload=b"{}",
        )  # fmt: skip
        return [await queue.submit(submission) for _ in range(n)]
    finally:
        await redis.aclose()


async def _known_drain(redis_url: str, model: str) -> None:
    """Two jobs left in the engine that went away, and recent jobs that stayed 1 s in
    it: the queue's drain gives a queued job of ``model`` a wait estimate."""
    redis = Redis.from_url(redis_url)
    try:
        await redis.hset(keys.inflight(model), ENDPOINT, 2)
        async with redis.pipeline(transaction=False) as pipe:
            for _ in range(5):
                add_latency(pipe, model, Latency("default", 10, None, run_ms=1000))
            await pipe.execute()
    finally:
        await redis.aclose()


def _job(url: str, job_id: str) -> dict[str, Any]:
    answer = local_http.get(f"{url}/v1/jobs/{job_id}", headers=ALICE, timeout=5)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_queued_job_of_a_model_without_a_ready_endpoint_says_it_is_starting(
    stack: tuple[Settings, str, str], redis_url: str, tmp_path: Path
) -> None:
    settings, url, engine = stack
    (job_id,) = asyncio.run(_submit(settings, COLD))
    asyncio.run(_known_drain(redis_url, COLD))
    before = _job(url, job_id)
    assert before["status"] == "queued" and before["model_state"] is None  # nobody knows yet
    assert before["queue_position"]["estimated_wait_s"] > 0  # the queue's drain tells one
    with dispatcher_process(_config(engine), redis_url, tmp_path):
        body = eventually(
            lambda: _job(url, job_id),
            "the cold model to show as starting",
            15,
            until=lambda b: b["model_state"] == "starting",
        )
        assert body["status"] == "queued"  # held in the queue, not failed
        assert body["queue_position"] == {
            "jobs_ahead": 0,
            "estimated_wait_s": None,
            "estimated_wait_reason": STARTING,
        }


def test_a_queued_job_of_a_model_with_a_ready_endpoint_says_it_is_ready(
    stack: tuple[Settings, str, str], redis_url: str, tmp_path: Path
) -> None:
    settings, url, engine = stack
    with dispatcher_process(_config(engine), redis_url, tmp_path):
        first, second = asyncio.run(_submit(settings, MODEL, 2))
        body = eventually(
            lambda: _job(url, second),
            "the served model to show as ready",
            15,
            until=lambda b: b["model_state"] == "ready",
        )
        assert body["status"] == "queued" and body["queue_position"]["jobs_ahead"] == 0
        dispatched = _job(url, first)
        assert dispatched["status"] == "dispatched"
        assert "model_state" not in dispatched and "queue_position" not in dispatched


def test_the_schema_documents_the_model_state_a_client_acts_on(
    stack: tuple[Settings, str, str],
) -> None:
    _, url, _ = stack
    schema = local_http.get(f"{url}/openapi.json", timeout=5).json()
    ok = schema["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]["200"]
    ref = ok["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    state = schema["components"]["schemas"][ref]["properties"]["model_state"]
    assert "starting" in str(state) and "ready" in str(state)
