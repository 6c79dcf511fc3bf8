"""The quotas' use where operators look: ``/admin/status``'s ``quotas`` (what the dashboard
draws: tests/integration/test_dashboard.py, in a browser), ``fairq status`` and its
``--json``, and the dispatcher's ``fairq_quota_*`` gauges (real Redis, real HTTP)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner
from redis.asyncio import Redis

from broker import JobQueue, RequestKind, Settings, StreamMode, Submission
from dispatcher.publisher import DispatcherCollector, StatusPublisher
from dispatcher.service import Dispatcher
from fairq.cli import main
from tests.support.quota import within_one_minute
from tests.support.settings import ADMIN, MODEL, make_config
from tests.support.stack import gateway

QUOTAS = [
    {"tenant": "alice", "tokens_per_minute": 1_000, "requests_per_day": 10},
    {"user": "bob", "tokens_per_day": 500},
]
CONFIG = make_config(quotas=QUOTAS)


def asking(user: str, tokens: int) -> Submission:
    return Submission(
        model=MODEL, owner=user, user=user, tenant=user, band="default", tokens=tokens,
        kind=RequestKind.CHAT, stream_flag=StreamMode.STREAMED, payload=b"{}",
    )  # fmt: skip


async def _alice_asks_twice(redis: Redis, s: Settings) -> None:
    await within_one_minute(redis, room_s=5)
    queue = JobQueue(redis, s)
    for tokens in (30, 50):
        await queue.submit(asking("alice", tokens))


def _by_limit(quotas: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(q["scope"], q["name"], lim["name"]): lim for q in quotas for lim in q["limits"]}


def _assert_alice_used_80_tokens_and_2_requests(quotas: list[dict[str, Any]]) -> None:
    limits = _by_limit(quotas)
    assert list(limits) == [
        ("tenant", "alice", "tokens_per_minute"),
        ("tenant", "alice", "requests_per_day"),
        ("user", "bob", "tokens_per_day"),
    ]  # the configured quotas, in their order, each with the limits it has
    minute = limits["tenant", "alice", "tokens_per_minute"]
    assert (minute["used"], minute["limit"], minute["remaining"]) == (80, 1_000, 920)
    assert 0 < minute["reset_s"] <= 60
    day = limits["tenant", "alice", "requests_per_day"]
    assert (day["used"], day["limit"], day["remaining"]) == (2, 10, 8)
    assert 0 < day["reset_s"] <= 86_400
    bob = limits["user", "bob", "tokens_per_day"]
    assert (bob["used"], bob["remaining"]) == (0, 500)  # never charged: 0


async def test_admin_status_lists_each_quotas_use_of_each_limit(
    aredis: Redis, redis_url: str
) -> None:
    s = Settings(redis_url=redis_url, **CONFIG)
    await _alice_asks_twice(aredis, s)
    with gateway(s) as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/admin/status", headers=ADMIN)
    assert response.status_code == 200
    _assert_alice_used_80_tokens_and_2_requests(response.json()["quotas"])


async def test_without_quotas_the_status_lists_none(aredis: Redis, redis_url: str) -> None:
    with gateway(Settings(redis_url=redis_url, **make_config())) as url:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{url}/admin/status", headers=ADMIN)
    assert response.json()["quotas"] == []


async def test_the_dispatcher_exports_each_limits_use_and_limit(
    aredis: Redis, redis_url: str
) -> None:
    s = Settings(redis_url=redis_url, **CONFIG)
    await _alice_asks_twice(aredis, s)
    publisher = StatusPublisher(s, aredis, Dispatcher(s, aredis))
    await publisher.refresh_quotas()
    samples = {
        (f.name, tuple(sample.labels.values())): sample.value
        for f in DispatcherCollector(publisher).collect()
        if f.name.startswith("fairq_quota_")
        for sample in f.samples
    }
    assert samples == {
        ("fairq_quota_used", ("tenant", "alice", "tokens_per_minute")): 80,
        ("fairq_quota_limit", ("tenant", "alice", "tokens_per_minute")): 1_000,
        ("fairq_quota_used", ("tenant", "alice", "requests_per_day")): 2,
        ("fairq_quota_limit", ("tenant", "alice", "requests_per_day")): 10,
        ("fairq_quota_used", ("user", "bob", "tokens_per_day")): 0,
        ("fairq_quota_limit", ("user", "bob", "tokens_per_day")): 500,
    }


async def _queue_apart(redis_url: str) -> None:
    redis = Redis.from_url(redis_url)
    try:
        await _alice_asks_twice(redis, Settings(redis_url=redis_url, **CONFIG))
    finally:
        await redis.aclose()


def test_fairq_status_prints_the_quotas_and_its_json_has_them(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(_queue_apart(redis_url))  # the commands run their own event loop
    config = tmp_path / "fairq.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    monkeypatch.setenv("FAIRQ_CONFIG", str(config))
    monkeypatch.setenv("FAIRQ_REDIS_URL", redis_url)
    shown = CliRunner().invoke(main, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    _assert_alice_used_80_tokens_and_2_requests(json.loads(shown.output)["quotas"])
    text = CliRunner().invoke(main, ["status"])
    assert text.exit_code == 0, text.output
    rows = [line.split() for line in text.output.splitlines() if "tokens_per" in line]
    assert rows[0][:6] == ["tenant", "alice", "tokens_per_minute", "80", "1000", "920"]
    assert rows[1][:6] == ["user", "bob", "tokens_per_day", "0", "500", "500"]
