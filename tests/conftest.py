"""Shared fixtures: one private Redis server per test session, flushed between tests; the
process groups a test starts, and the net that kills what a test left running
(tests/support/processes.py). Each test process (one per pytest-xdist worker) hands out
ports from a range of its own, below the kernel's ephemeral range."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import fakeredis
import pytest
import redis
from redis.asyncio import Redis

from fairq.stack.localredis import LOCAL_PORTS_ENV, LocalRedis
from tests.support.processes import (  # noqa: F401 - fixtures
    for_the_session,
    no_process_left,
    processes,
)

# Below Linux's default ephemeral range (32768-60999), split among the test processes;
# set here, at import, so that every child a test starts inherits its process's range.
PORTS_LOW, PORTS_HIGH = 10000, 32767


def ports_of_test_process(worker: str | None, workers: int) -> tuple[int, int]:
    """The range of ports of the test process ``worker`` (``gw0``, ``gw1``, ...; None when
    pytest-xdist is not running) among ``workers``."""
    index = int(worker.removeprefix("gw")) if worker else 0
    size = (PORTS_HIGH - PORTS_LOW + 1) // max(workers, 1)
    low = PORTS_LOW + index * size
    return low, low + size - 1


_low, _high = ports_of_test_process(
    os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
)
os.environ[LOCAL_PORTS_ENV] = f"{_low}-{_high}"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    """A real redis/valkey server on a free loopback port, torn down after the session."""
    # It dies with the test process, even one killed (a timeout) before its teardown.
    with LocalRedis(die_with_parent=True) as server:
        assert server.process is not None
        for_the_session(server.process.pid)
        yield server


@pytest.fixture
def redis_url(redis_server: LocalRedis) -> str:
    """The session server's URL, emptied before each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(params=["real", "fake"])
async def r(request: pytest.FixtureRequest) -> AsyncIterator[Redis]:
    """The broker contract suites' Redis: the session's real server, then fakeredis."""
    if request.param == "real":
        client = Redis.from_url(request.getfixturevalue("redis_url"))
    else:
        client = fakeredis.FakeAsyncRedis()
    yield client
    await client.aclose()


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()
