"""The hand-packed pipeline (broker.packed) against the session's real Redis."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from servers import silent_server

from broker import packed
from broker.packed import PackedPipeline
from broker.redis_conn import CLIENT_OPTIONS


async def test_replies_come_back_in_order_and_raw(aredis: Redis) -> None:
    pipe = PackedPipeline(aredis)
    pipe.execute_command("XADD", "s", b"0-1", b"d", b"one")
    pipe.execute_command(b"SET", "n", 41)
    pipe.execute_command("INCRBYFLOAT", "n", 0.5)
    pipe.execute_command("GET", "missing")
    assert len(pipe) == 4
    assert await pipe.execute() == [b"0-1", b"OK", b"41.5", None]
    assert len(pipe) == 0  # a pipeline is empty again after it ran
    assert await aredis.xrange("s") == [(b"0-1", {b"d": b"one"})]


async def test_an_error_reply_takes_its_place_and_the_rest_still_run(aredis: Redis) -> None:
    pipe = PackedPipeline(aredis)
    pipe.execute_command("XADD", "s", b"0-2", b"d", b"two")
    pipe.execute_command("XADD", "s", b"0-1", b"d", b"late")  # smaller id: refused
    pipe.execute_command("XADD", "s", b"0-3", b"d", b"three")
    first, refused, third = await pipe.execute()
    assert (first, third) == (b"0-2", b"0-3")
    assert isinstance(refused, ResponseError) and "equal or smaller" in str(refused)
    # The connection went back to the pool in step: the next command gets its own reply.
    assert await aredis.xlen("s") == 2


async def test_an_unknown_script_is_a_no_script_error(aredis: Redis) -> None:
    pipe = PackedPipeline(aredis)
    pipe.evalsha("0" * 40, 1, "k", "arg")
    [reply] = await pipe.execute()
    assert isinstance(reply, NoScriptError)
    pipe.evalsha("0" * 40, 0)
    with pytest.raises(NoScriptError):
        await pipe.execute(raise_on_error=True)


async def test_a_script_gets_its_keys_and_arguments(aredis: Redis) -> None:
    sha = await aredis.script_load("return {KEYS[1], ARGV[1], ARGV[2]}")
    pipe = PackedPipeline(aredis)
    pipe.evalsha(sha, 1, "key", "é", 7)
    assert await pipe.execute() == [[b"key", "é".encode(), b"7"]]


async def test_nothing_to_send_needs_no_connection(aredis: Redis) -> None:
    assert await PackedPipeline(aredis).execute() == []


async def test_a_round_trip_that_gets_no_reply_fails_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """fairq's clients have no per-command socket time-out: the pipeline bounds itself."""
    monkeypatch.setattr(packed, "ROUND_TRIP_S", 0.3)
    async with silent_server() as url:
        client = Redis.from_url(url, **CLIENT_OPTIONS)
        pipe = PackedPipeline(client)
        pipe.execute_command("XADD", "s", b"0-1", b"d", b"one")
        with pytest.raises(RedisTimeoutError, match="did not answer a pipeline"):
            await pipe.execute()
        await client.aclose()
