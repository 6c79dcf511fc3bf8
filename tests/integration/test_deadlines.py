"""Deadlines and cancellation: queued jobs expire, cancelled jobs never start, and a
running job that is cancelled is aborted at the engine.

Real Redis, the simulator and the gateway under uvicorn, the dispatcher and a
worker (whose sweeper expires overdue jobs) in the test's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from broker import AsyncClient, keys
from tests.support.eventually import WAIT_S, aeventually
from tests.support.settings import ALICE, BOB, BOB_KEY, MODEL, make_settings
from tests.support.stack import chat, components, job_field, metric, sim, state_is
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

DEADLINES = {"interactive": 0.3}  # the keys' default band; default and batch: none


@pytest.fixture
def engine() -> Iterator[str]:
    with sim() as url:
        yield url


async def test_a_queued_job_past_its_bands_deadline_expires_and_leaves_no_trace(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True, queue_deadline_s=DEADLINES)
    with gateway_server(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
            # No dispatcher yet: both jobs wait. Only alice's band has a deadline.
            async with AsyncClient(settings, api_key=BOB_KEY) as bob:
                kept_id = await bob.submit(MODEL, band="batch", prompt="x", max_tokens=3)
            async with components(settings, dispatcher=False):
                expired = await http.post("/v1/chat/completions", json=chat(), headers=ALICE)
                async with http.stream(
                    "POST", "/v1/chat/completions", json=chat(stream=True), headers=ALICE
                ) as streamed:
                    body = await streamed.aread()
            job_id = expired.headers["x-fairq-job-id"]
            job = (await http.get(f"/v1/jobs/{job_id}", headers=ALICE)).json()
            assert (await http.get(f"/v1/jobs/{kept_id}", headers=BOB)).json()["status"] == "queued"
    assert expired.status_code == 408
    assert expired.json()["error"]["code"] == "job_expired"
    assert job["status"] == "expired" and job["dispatched_at_ms"] is None
    # Streamed, it expired before any output: the same answer as not streamed.
    assert (streamed.status_code, orjson.loads(body)) == (408, expired.json())
    # The queue's bookkeeping is as if alice had never queued (dispatch.lua relies on it).
    assert await aredis.zrange(keys.backlog(MODEL, "interactive"), 0, -1) == []
    assert await aredis.exists(keys.queue(MODEL, "interactive", "alice")) == 0
    assert int(await aredis.hget(keys.queued_counts(MODEL), "interactive") or 0) == 0
    assert (
        int(await aredis.hget(keys.meta(MODEL), keys.tenant_field("interactive", "alice")) or 0)
        == 0
    )
    assert await aredis.zrange(keys.backlog(MODEL, "batch"), 0, -1) == [b"bob"]


async def test_jobs_queued_after_an_expiry_are_dispatched_and_served_normally(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True, queue_deadline_s=DEADLINES)
    with gateway_server(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
            async with components(settings, dispatcher=False):
                expired = await http.post("/v1/chat/completions", json=chat(), headers=ALICE)
            assert expired.status_code == 408
            async with components(settings):
                served = await http.post(
                    "/v1/chat/completions", json=chat(max_tokens=3), headers=ALICE
                )
    assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 3
    assert int(await aredis.hget(keys.queued_counts(MODEL), "interactive") or 0) == 0


async def test_a_job_cancelled_after_dispatch_never_starts_at_a_worker_or_the_engine(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True)
    with gateway_server(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
            async with components(settings, workers=0):  # a dispatcher, no worker
                request = asyncio.create_task(
                    http.post("/v1/chat/completions", json=chat(), headers=BOB)
                )
                job_id = await aeventually(lambda: _one_job(aredis), "the job")
                await aeventually(
                    lambda: state_is(aredis, job_id, "dispatched"), "the job to be dispatched"
                )
                cancelled = await http.delete(f"/v1/jobs/{job_id}", headers=BOB)
                assert (await request).status_code == 409
            async with components(settings):  # now a worker: it must not start the job
                after = await http.post("/v1/chat/completions", json=chat(), headers=BOB)
            job = (await http.get(f"/v1/jobs/{job_id}", headers=BOB)).json()
    assert cancelled.json()["status"] == "cancelled" and after.status_code == 200
    assert job["status"] == "cancelled" and job["started_at_ms"] is None and job["attempts"] == 0
    finished = metric(engine, "vllm:request_success_total", finished_reason="stop")
    aborted = metric(engine, "vllm:request_success_total", finished_reason="abort")
    assert (finished, aborted) == (1, 0)  # only the later job reached the engine


async def test_a_running_job_cancelled_through_the_api_is_aborted_at_the_engine(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True)
    before = metric(engine, "vllm:request_success_total", finished_reason="abort")
    with gateway_server(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http, components(settings):
            async with http.stream(
                "POST", "/v1/chat/completions", headers=ALICE,
                json=chat(stream=True, max_tokens=3000),
            ) as response:  # fmt: skip
                job_id = response.headers["x-fairq-job-id"]
                await aeventually(
                    lambda: aredis.xlen(keys.results(MODEL, job_id)), "output in Redis"
                )
                await http.delete(f"/v1/jobs/{job_id}", headers=ALICE)
                body = await response.aread()
            await aeventually(
                lambda: (
                    metric(engine, "vllm:request_success_total", finished_reason="abort") > before
                ),
                "the engine to abort the request",
            )
    assert b'"code":"job_cancelled"' in body
    assert await job_field(aredis, job_id, "st") == "cancelled"
    assert metric(engine, "vllm:request_success_total", finished_reason="abort") == before + 1
    assert metric(engine, "vllm:request_success_total", finished_reason="length") == 0


async def _one_job(redis: Redis) -> str | None:
    ids = [k.decode().rsplit(":", 1)[1] async for k in redis.scan_iter(match="*:job:*")]
    return ids[0] if len(ids) == 1 else None
