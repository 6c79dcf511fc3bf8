"""The hand-packed pipeline (broker.redis.packed) on its lean connection
(broker.redis.resp), against the session's real Redis and against servers that misbehave
on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.redis import resp
from broker.redis.packed import PackedPipeline
from broker.redis.resp import RespLink
from fairq.stack.localredis import LocalRedis
from tests.support.servers import silent_server


@pytest.fixture
async def link(redis_url: str) -> AsyncIterator[RespLink]:
    link = RespLink(redis_url)
    yield link
    link.close()


async def test_replies_come_back_in_order_and_raw(link: RespLink, aredis: Redis) -> None:
    pipe = PackedPipeline(link)
    pipe.execute_command("XADD", "s", b"0-1", b"d", b"one")
    pipe.execute_command(b"SET", "n", 41)
    pipe.execute_command("INCRBYFLOAT", "n", 0.5)
    pipe.execute_command("GET", "missing")
    assert len(pipe) == 4
    assert await pipe.execute() == [b"0-1", b"OK", b"41.5", None]
    assert len(pipe) == 0  # a pipeline is empty again after it ran
    assert await aredis.xrange("s") == [(b"0-1", {b"d": b"one"})]


async def test_xadd_packs_as_redis_py_would(link: RespLink, aredis: Redis) -> None:
    pipe = PackedPipeline(link)
    pipe.xadd("s", {b"d": b"\r\n\x00 bytes"}, id=b"0-1")
    pipe.xadd(b"s", {b"a": b"1", b"b": b""}, id=b"0-2")
    assert await pipe.execute() == [b"0-1", b"0-2"]
    assert await aredis.xrange("s") == [
        (b"0-1", {b"d": b"\r\n\x00 bytes"}),
        (b"0-2", {b"a": b"1", b"b": b""}),
    ]


async def test_an_error_reply_takes_its_place_and_the_rest_still_run(
    link: RespLink, aredis: Redis
) -> None:
    pipe = PackedPipeline(link)
    pipe.execute_command("XADD", "s", b"0-2", b"d", b"two")
    pipe.execute_command("XADD", "s", b"0-1", b"d", b"late")  # smaller id: refused
    pipe.execute_command("XADD", "s", b"0-3", b"d", b"three")
    first, refused, third = await pipe.execute()
    assert (first, third) == (b"0-2", b"0-3")
    assert isinstance(refused, ResponseError) and "equal or smaller" in str(refused)
    # The connection stays in step: the next round trip gets its own replies.
    pipe.execute_command("XLEN", "s")
    assert await pipe.execute() == [2]


async def test_an_unknown_script_is_a_no_script_error(link: RespLink) -> None:
    pipe = PackedPipeline(link)
    pipe.evalsha("0" * 40, 1, "k", "arg")
    [reply] = await pipe.execute()
    assert isinstance(reply, NoScriptError)
    pipe.evalsha("0" * 40, 0)
    with pytest.raises(NoScriptError):
        await pipe.execute(raise_on_error=True)


async def test_a_script_gets_its_keys_and_arguments(link: RespLink, aredis: Redis) -> None:
    sha = await aredis.script_load("return {KEYS[1], ARGV[1], ARGV[2]}")
    pipe = PackedPipeline(link)
    pipe.evalsha(sha, 1, "key", "é", 7)
    assert await pipe.execute() == [[b"key", "é".encode(), b"7"]]


async def test_nothing_to_send_needs_no_connection() -> None:
    link = RespLink("redis://127.0.0.1:1/0")  # nothing listens there
    assert await PackedPipeline(link).execute() == []


async def test_replies_split_across_reads_are_put_together(link: RespLink) -> None:
    """Many commands whose replies cannot arrive in one read."""
    pipe = PackedPipeline(link)
    big = b"x" * 300_000
    pipe.execute_command("SET", "big", big)
    for _ in range(2_000):
        pipe.execute_command("INCR", "n")
    pipe.execute_command("GET", "big")
    replies = await pipe.execute()
    assert replies[0] == b"OK" and replies[1:-1] == list(range(1, 2_001))
    assert replies[-1] == big


async def test_auth_and_database_come_from_the_url() -> None:
    with LocalRedis(password="s3cret") as server:
        base = f"redis://:s3cret@127.0.0.1:{server.port}"
        pipe = PackedPipeline(RespLink(f"{base}/3"))
        pipe.execute_command("SET", "where", "db3")
        assert await pipe.execute() == [b"OK"]
        check = Redis.from_url(f"{base}/3")
        assert await check.get("where") == b"db3"
        await check.aclose()
        wrong = RespLink(f"redis://:nope@127.0.0.1:{server.port}/0")
        pipe = PackedPipeline(wrong)
        pipe.execute_command("PING")
        with pytest.raises(ResponseError, match=r"WRONGPASS|invalid"):
            await pipe.execute()


async def test_a_round_trip_that_gets_no_reply_fails_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fairq's hot-path connection has no socket time-out: each round trip bounds itself."""
    monkeypatch.setattr(resp, "ROUND_TRIP_S", 0.3)
    async with silent_server() as url:
        pipe = PackedPipeline(RespLink(url))
        pipe.execute_command("XADD", "s", b"0-1", b"d", b"one")
        with pytest.raises(RedisTimeoutError, match="did not answer"):
            await pipe.execute()


async def test_a_refused_connection_is_a_connection_error() -> None:
    pipe = PackedPipeline(RespLink("redis://127.0.0.1:1/0"))
    pipe.execute_command("PING")
    with pytest.raises(RedisConnectionError, match="cannot reach Redis"):
        await pipe.execute()


async def test_after_a_server_restart_the_next_round_trip_reconnects() -> None:
    with LocalRedis() as server:
        link = RespLink(server.url)
        pipe = PackedPipeline(link)
        pipe.execute_command("PING")
        assert await pipe.execute() == [b"PONG"]
        server.restart(kill=True)
        pipe.execute_command("PING")
        # The old connection is gone: either this round trip finds it closed (and fails)
        # or it was already seen closed; the one after it reconnects in any case.
        try:
            assert await pipe.execute() == [b"PONG"]
        except RedisConnectionError:
            pipe.execute_command("PING")
            assert await pipe.execute() == [b"PONG"]
        link.close()


async def test_a_cancelled_caller_leaves_the_connection_in_step(link: RespLink) -> None:
    """Its replies still come, in their turn, and are dropped: the next caller on the same
    connection gets its own reply, not the cancelled caller's."""
    pipe = PackedPipeline(link)
    pipe.execute_command("BLPOP", "nothing", "0.3")  # answers nil after 0.3 s
    task = asyncio.ensure_future(pipe.execute())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pipe.execute_command("PING")
    assert await asyncio.wait_for(pipe.execute(), 2) == [b"PONG"]


async def test_concurrent_callers_each_get_their_own_replies(link: RespLink, aredis: Redis) -> None:
    """Round trips from many tasks are pipelined on one connection."""

    async def bump(n: int) -> list[object]:
        pipe = PackedPipeline(link)
        pipe.execute_command("SET", f"k{n}", n)
        pipe.execute_command("INCR", f"k{n}")
        pipe.execute_command("GET", f"k{n}")
        return await pipe.execute()

    replies = await asyncio.gather(*(bump(n) for n in range(200)))
    assert replies == [[b"OK", n + 1, b"%d" % (n + 1)] for n in range(200)]
    clients = await aredis.client_list()
    assert len(clients) == 2  # the link's one connection and this check's


async def test_a_round_trip_that_times_out_fails_every_round_trip_on_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resp, "ROUND_TRIP_S", 0.3)
    async with silent_server() as url:
        link = RespLink(url)

        async def ping(timeout_s: float) -> list[object]:
            return await link.round_trip(b"*1\r\n$4\r\nPING\r\n", 1, timeout_s)

        late = asyncio.ensure_future(ping(5.0))
        await asyncio.sleep(0.01)
        with pytest.raises(RedisTimeoutError, match="did not answer"):
            await ping(0.2)
        with pytest.raises(RedisTimeoutError, match=r"did not answer within 0\.2 s"):
            await late  # on the same connection: it fails with it, at once


async def test_a_round_trip_after_an_answered_one_still_fails_at_its_own_bound(
    link: RespLink,
) -> None:
    """The connection's one watchdog was armed for the first round trip, which was
    answered; when it fires it must wait on for the second one's deadline."""
    ping = b"*1\r\n$4\r\nPING\r\n"
    assert await link.round_trip(ping, 1, 0.3) == [b"PONG"]
    blpop = resp.pack("BLPOP", "nothing", "5")  # Redis answers it after 5 s
    with pytest.raises(RedisTimeoutError, match=r"did not answer within 0\.6 s"):
        await asyncio.wait_for(link.round_trip(blpop, 1, 0.6), 3)
    assert await link.round_trip(ping, 1) == [b"PONG"]  # on a new connection


async def test_bytes_that_are_not_resp_break_the_connection() -> None:
    writers: list[asyncio.StreamWriter] = []

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read(100)
        writer.write(b"!not resp\r\n")

    server = await asyncio.start_server(garbage, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pipe = PackedPipeline(RespLink(f"redis://127.0.0.1:{port}/0"))
    pipe.execute_command("PING")
    with pytest.raises(RedisConnectionError, match="not RESP"):
        await pipe.execute()
    for writer in writers:
        writer.close()
        await writer.wait_closed()
    server.close()
    await server.wait_closed()
