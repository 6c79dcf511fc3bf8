"""The multiplexed result reader (broker.results) against the session's real Redis.

Its read blocks for a minute here: a follower that joins a blocked read must be taken
in through the bell at once, or its first event would wait for that minute and the
waits below (a few seconds) would fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis

from broker import keys, results
from broker.process.mailbox import Mailbox
from broker.redis.resp import RespLink
from broker.results import ResultEvent, ResultReader
from tests.support.servers import silent_server

BLOCK_MS = 60_000
WAIT_S = 5.0
MODEL = "m"


@pytest.fixture(params=["redis-py", "lean"])
def ring_link(request: pytest.FixtureRequest, redis_url: str) -> Iterator[RespLink | None]:
    """How the reader rings its bell: through redis-py, or a shared lean connection."""
    link = RespLink(redis_url) if request.param == "lean" else None
    yield link
    if link is not None:
        link.close()


@pytest.fixture
async def reader(
    redis_url: str, aredis: Redis, ring_link: RespLink | None
) -> AsyncIterator[ResultReader]:
    bell = keys.reader_bell("t")
    reader = ResultReader(RespLink(redis_url), aredis, bell, BLOCK_MS, ring_link=ring_link)
    reader.start()
    yield reader
    await reader.close()


async def _chunk(redis: Redis, job: str, seq: int) -> None:
    await redis.xadd(keys.results(MODEL, job), {b"d": b"data: %d\n\n" % seq}, id=f"0-{seq}")


async def _blocked(redis: Redis) -> None:
    """Until the reader's XREAD is blocked in Redis."""
    for _ in range(500):
        if int((await redis.info("clients"))["blocked_clients"]) >= 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the reader never blocked")


async def test_a_follower_joining_a_blocked_read_gets_its_events(
    reader: ResultReader, aredis: Redis
) -> None:
    async with reader.follow(MODEL, "a") as first:
        await _blocked(aredis)  # blocked on stream a and the bell only
        async with reader.follow(MODEL, "b") as second:
            await _chunk(aredis, "b", 1)
            event = await asyncio.wait_for(second.get(), WAIT_S)
            assert event.chunk == b"data: 1\n\n" and event.id == b"0-1"
            await _chunk(aredis, "a", 1)
            assert (await asyncio.wait_for(first.get(), WAIT_S)).id == b"0-1"
    assert first.empty() and second.empty()  # each got its own stream's events only


async def test_events_written_before_the_follower_joined_are_read(
    reader: ResultReader, aredis: Redis
) -> None:
    async with reader.follow(MODEL, "idle"):
        await _blocked(aredis)
        for seq in (1, 2, 3):
            await _chunk(aredis, "c", seq)
        async with reader.follow(MODEL, "c", after=b"0-1") as queue:
            ids = [(await asyncio.wait_for(queue.get(), WAIT_S)).id for _ in range(2)]
    assert ids == [b"0-2", b"0-3"]


async def test_a_follower_joining_a_read_in_flight_from_a_later_entry_misses_nothing(
    reader: ResultReader, aredis: Redis
) -> None:
    # A client that resumes a stream its first connection still follows: the read in
    # flight asks for what comes after the first follower's position, and its reply must
    # not move the newcomer past the entries in between.
    for seq in (1, 2, 3, 4, 5):
        await _chunk(aredis, "r", seq)
    async with reader.follow(MODEL, "r") as first:
        for _ in range(5):
            await asyncio.wait_for(first.get(), WAIT_S)
        await _blocked(aredis)  # blocked after 0-5
        async with reader.follow(MODEL, "r", after=b"0-2") as second:
            await _chunk(aredis, "r", 6)  # may reach the read in flight before the bell
            ids: list[bytes] = []
            while not ids or ids[-1] != b"0-6":  # the last entry: at most six events
                ids.append((await asyncio.wait_for(second.get(), WAIT_S)).id)
        assert (await asyncio.wait_for(first.get(), WAIT_S)).id == b"0-6"
    assert ids == [b"0-3", b"0-4", b"0-5", b"0-6"]


async def test_many_joins_ring_the_bell_a_few_times_and_close_removes_it(
    redis_url: str, aredis: Redis, ring_link: RespLink | None
) -> None:
    bell = keys.reader_bell("many")
    reader = ResultReader(RespLink(redis_url), aredis, bell, BLOCK_MS, ring_link=ring_link)
    reader.start()
    async with reader.follow(MODEL, "first"):
        await _blocked(aredis)
        jobs = [f"j{i}" for i in range(20)]
        async with _following(reader, jobs) as queues:
            for job in jobs:
                await _chunk(aredis, job, 1)
            for queue in queues:
                assert (await asyncio.wait_for(queue.get(), WAIT_S)).id == b"0-1"
        rings = (await aredis.xinfo_stream(bell))["entries-added"]
        assert 1 <= rings < len(jobs)  # joins while a ring is pending share it
    await reader.close()
    assert not await aredis.exists(bell)


class _following:
    """Follow several jobs at once (an async context manager over many ``follow``s)."""

    def __init__(self, reader: ResultReader, jobs: list[str]) -> None:
        self._managers = [reader.follow(MODEL, job) for job in jobs]

    async def __aenter__(self) -> list[Mailbox[ResultEvent]]:
        return [await m.__aenter__() for m in self._managers]

    async def __aexit__(self, *exc: object) -> None:
        for manager in reversed(self._managers):
            await manager.__aexit__(None, None, None)


async def test_a_read_that_gets_no_reply_fails_at_its_bound_and_the_reader_retries(
    monkeypatch: pytest.MonkeyPatch, aredis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The reader's client has no socket time-out: a hung Redis must not hang it for good."""
    monkeypatch.setattr(results, "READ_MARGIN_S", 0.2)
    async with silent_server() as url:
        reader = ResultReader(RespLink(url), aredis, keys.reader_bell("hung"), 100)
        reader.start()
        with caplog.at_level(logging.WARNING, logger="broker.results"):
            async with reader.follow(MODEL, "x"):
                for _ in range(250):  # a few seconds at most
                    if caplog.text.count("did not answer the result reader") >= 2:  # retried
                        break
                    await asyncio.sleep(0.02)
        await reader.close()
    assert caplog.text.count("TimeoutError: Redis did not answer the result reader within") >= 2
