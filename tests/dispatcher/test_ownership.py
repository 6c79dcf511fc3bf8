"""Dispatcher replicas share models by leases: the pure share plan, the leases against a
real Redis, and a real dispatcher process killed while the other takes over its models."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis
from redis.asyncio import Redis

from broker import Client, JobState, OwnershipStore, keys
from dispatcher.ownership import Ownership, plan
from fairq.stack.processes import Stack
from tests.support.eventually import aeventually, eventually
from tests.support.settings import make_settings
from tests.support.stack import demo_stack

MODELS = [f"m{i}" for i in range(4)]


def test_a_lone_replica_takes_every_model() -> None:
    todo = plan(MODELS, set(), alive=1, me="a")
    assert sorted(todo.acquire) == MODELS and todo.wanted == 4 and todo.release == []


def test_a_replica_above_its_share_gives_back_the_excess() -> None:
    todo = plan(MODELS, set(MODELS), alive=2, me="a")
    assert len(todo.release) == 2 and todo.wanted == 0
    todo = plan(MODELS, set(MODELS[:1]), alive=2, me="a")
    assert todo.release == [] and todo.wanted == 1 and MODELS[0] not in todo.acquire


def test_an_uneven_share_rounds_up_so_every_model_can_be_owned() -> None:
    assert plan(MODELS[:3], set(), alive=2, me="a").wanted == 2


def test_replicas_prefer_different_models() -> None:
    models = [f"model-{i}" for i in range(100)]
    a = set(plan(models, set(), alive=2, me="replica-a").acquire[:50])
    b = set(plan(models, set(), alive=2, me="replica-b").acquire[:50])
    assert len(a) == len(b) == 50
    assert 10 < len(a & b) < 40  # independent preferences: about half overlap, not all


def _replica(r: Redis, me: str, lease_ms: int, seen: list[frozenset[str]]) -> Ownership:
    return Ownership(OwnershipStore(r), MODELS, me, lease_ms, seen.append)


async def test_two_replicas_split_the_models_and_a_silent_one_loses_them(aredis: Redis) -> None:
    seen_a: list[frozenset[str]] = []
    a = _replica(aredis, "a", 300, seen_a)
    b = _replica(aredis, "b", 300, [])
    assert await a.round() == frozenset(MODELS)  # alone: everything
    assert await b.round() == frozenset()  # all taken; now two are alive
    assert len(await a.round()) == 2  # a gives back its excess...
    assert len(await b.round()) == 2  # ...and b takes it
    assert a.owned.isdisjoint(b.owned)
    owners = {m: await aredis.get(keys.owner(m)) for m in MODELS}
    assert sorted(owners.values()) == [b"a", b"a", b"b", b"b"]
    await asyncio.sleep(0.4)  # a stops renewing: its heartbeat and leases lapse
    assert await b.round() == frozenset(MODELS)
    assert await a.round() == frozenset()  # a comes back: its renewals are refused
    assert seen_a[-1] == frozenset()  # and it was told


async def test_a_lease_lost_in_a_redis_restart_is_not_blamed_on_another_dispatcher(
    aredis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    a = _replica(aredis, "a", 60_000, [])
    assert await a.round() == frozenset(MODELS)
    await aredis.flushall()  # what a Redis that restarted without the leases holds
    with caplog.at_level(logging.WARNING, logger="dispatcher.ownership"):
        assert await a.round() == frozenset(MODELS)  # nobody else: all taken again at once
    assert "another dispatcher" not in caplog.text and "took over" not in caplog.text
    assert "lapsed" in caplog.text and "Redis restarted" in caplog.text


async def test_a_lease_another_dispatcher_took_names_that_dispatcher(
    aredis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    a = _replica(aredis, "a", 60_000, [])
    assert await a.round() == frozenset(MODELS)
    await aredis.delete(keys.owner(MODELS[0]))  # a's lease of m0 lapsed, and b took it
    await aredis.set(keys.owner(MODELS[0]), "b")
    with caplog.at_level(logging.WARNING, logger="dispatcher.ownership"):
        assert await a.round() == frozenset(MODELS[1:])
    assert f"dispatcher b took over models ['{MODELS[0]}']" in caplog.text
    assert "lapsed before" not in caplog.text


async def test_a_clean_stop_hands_the_models_over_at_once(aredis: Redis) -> None:
    a = _replica(aredis, "a", 60_000, [])
    b = _replica(aredis, "b", 60_000, [])
    task = asyncio.create_task(a.run())
    await aeventually(lambda: a.owned, "a's first round", 1, interval_s=0.01)
    assert a.owned == frozenset(MODELS)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert [await aredis.get(keys.owner(m)) for m in MODELS] == [None] * len(MODELS)
    assert await b.round() == frozenset(MODELS)  # no need to wait out a minute's lease


@pytest.fixture
def two_dispatchers(redis_url: str) -> Iterator[Stack]:
    env = {"FAIRQ_DISPATCHER_LEASE_MS": "600"}
    with demo_stack(redis_url=redis_url, gateway=False, dispatchers=2, env=env) as stack:
        yield stack


def _owners(r: redis.Redis) -> dict[str, bytes | None]:
    return {m: r.get(keys.owner(m)) for m in ("demo-chat", "demo-code")}


@pytest.mark.integration
def test_a_killed_dispatcher_loses_its_models_to_the_other(
    two_dispatchers: Stack, redis_url: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    eventually(
        lambda: _owners(r),
        "one model each",
        10,
        until=lambda owners: len({o for o in owners.values() if o}) == 2,
        interval_s=0.05,
    )
    victim_name = _owners(r)["demo-chat"]
    assert victim_name is not None
    victim_pid = int(victim_name.decode().split("-")[-2])
    assert victim_pid in [p.pid for p in two_dispatchers.processes.values()]
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    survivor = _owners(r)["demo-code"]
    eventually(
        lambda: _owners(r),
        "the survivor owns both",
        10,
        until=lambda owners: set(owners.values()) == {survivor},
        interval_s=0.05,
    )
    # The lease (0.6 s) plus a renewal round (0.2 s) and the heartbeat's lapse, with slack
    # for a loaded machine; the default lease of 3 s gives about 4 s.
    assert time.monotonic() - killed_at < 5
    settings = make_settings(redis_url, **two_dispatchers.config)
    with Client(settings, api_key="fq-demo-alice") as client:
        job_id = client.submit("demo-chat", prompt="hello", max_tokens=4)
        assert client.result(job_id)["usage"]["completion_tokens"] == 4
        assert client.status(job_id).state is JobState.COMPLETED
    r.close()
