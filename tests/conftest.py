"""Shared fixtures: one private Redis server per test session, flushed between tests; the
process groups a test starts, and the net that kills what a test left running
(tests/support/processes.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import fakeredis
import pytest
import redis
from redis.asyncio import Redis

from fairq.localredis import LocalRedis
from tests.support.processes import (  # noqa: F401 - fixtures
    for_the_session,
    no_process_left,
    processes,
)


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
