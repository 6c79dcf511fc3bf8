"""``/admin/status``'s ``wait_now``: the wait the dashboard shows per model and band, what a
job queued now would be told (real Redis, real HTTP; the page that shows it:
tests/integration/test_dashboard.py, in a browser)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from redis.asyncio import Redis

from broker import (
    DispatchStore,
    ExecutionStore,
    JobQueue,
    Latency,
    Pick,
    RequestKind,
    StreamMode,
    Submission,
    add_latency,
    keys,
)
from broker.position import NO_DRAIN, STARTING
from tests.support.settings import ADMIN, ENDPOINT, MODEL, make_settings
from tests.support.stack import gateway


def submission(user: str) -> Submission:
    return Submission(
        model=MODEL, owner=user, user=user, tenant=user, band="default",
        kind=RequestKind.CHAT, stream_flag=StreamMode.STREAMED, payload=b"{}",
    )  # fmt: skip


async def _wait_now(redis_url: str) -> dict[str, Any]:
    with gateway(make_settings(redis_url)) as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/admin/status", headers=ADMIN)
    assert response.status_code == 200
    (model,) = response.json()["models"]
    return {w["band"]: w for w in model["wait_now"]}


async def test_each_band_shows_the_wait_of_a_new_users_job_and_of_one_at_the_back(
    aredis: Redis, redis_url: str
) -> None:
    s = make_settings(redis_url)
    q, d, x = JobQueue(aredis, s), DispatchStore(aredis, s), ExecutionStore(aredis, s)
    await x.ensure_groups([MODEL])
    for user, jobs in (("alice", 4), ("bob", 2)):
        for _ in range(jobs):
            await q.submit(submission(user))
    picks = [Pick("default", "alice", 1, 0.5), Pick("default", "alice", 2, 0.5)]
    await d.dispatch(MODEL, ENDPOINT, 100, picks, 10)
    await x.claim(aredis, [MODEL], "w1", count=10, block_ms=100)  # 2 of alice's run
    async with aredis.pipeline(transaction=False) as pipe:  # earlier jobs stayed 4 s
        for _ in range(2):
            add_latency(pipe, MODEL, Latency("default", 5, 40, run_ms=4_000))
        await pipe.execute()
    waits = await _wait_now(redis_url)
    assert list(waits) == list(s.bands)
    default = waits["default"]
    # 2 of alice's and 2 of bob's queued: a new user goes after one of each, by the drain's
    # rate (2 in the engine over 4 s stays: 0.5 per second)
    assert default["new_user"] == {
        "jobs_ahead": 2,
        "estimated_wait_s": 6.0,
        "estimated_wait_reason": None,
    }
    # at the back, behind all 4: the two slots free in ~4 s, then once per stay, twice
    back = default["back"]
    assert back["jobs_ahead"] == 4 and 11.0 <= back["estimated_wait_s"] <= 12.0
    assert waits["batch"]["back"]["jobs_ahead"] == 4  # the bands above go first


async def test_without_a_figure_to_back_the_wait_it_says_why(aredis: Redis, redis_url: str) -> None:
    s = make_settings(redis_url)
    await JobQueue(aredis, s).submit(submission("alice"))
    default = (await _wait_now(redis_url))["default"]
    assert default["back"] == {
        "jobs_ahead": 1,
        "estimated_wait_s": None,
        "estimated_wait_reason": NO_DRAIN,  # no dispatcher, nothing ran
    }
    # a dispatcher that sees no ready endpoint: the wait is the engine's start-up
    starting = {"model": MODEL, "source": "dispatcher", "bands": [],
                "endpoints": [{"url": ENDPOINT, "healthy": False, "drain_per_s": 2.0}]}  # fmt: skip
    await aredis.set(keys.status(MODEL), orjson.dumps(starting), ex=keys.STATUS_TTL_S)
    default = (await _wait_now(redis_url))["default"]
    assert default["new_user"]["estimated_wait_reason"] == STARTING
    assert default["back"] == {
        "jobs_ahead": 1,
        "estimated_wait_s": None,
        "estimated_wait_reason": STARTING,
    }
