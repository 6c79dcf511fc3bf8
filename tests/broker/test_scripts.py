"""How every Lua script is loaded and sent (broker.lua): one text per script, the prelude
and the file, by SHA over every path, loaded again wherever Redis lost it."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker import lua
from broker.lua import Script, load_scripts, script, script_names
from broker.redis.resp import RespLink


@pytest.fixture
async def link(redis_url: str) -> AsyncIterator[RespLink]:
    link = RespLink(redis_url)
    yield link
    link.close()


@pytest.mark.parametrize("over", ["lean link", "redis-py"])
async def test_a_script_redis_lost_is_loaded_again_and_an_error_reply_is_raised(
    over: str, link: RespLink, aredis: Redis
) -> None:
    """What the gateway's enqueue and the worker's start go through (the lean link), and
    every other call."""
    target = link if over == "lean link" else aredis
    echo = Script("echo", "return ARGV[1] .. KEYS[1]")
    await aredis.script_flush()  # as after a Redis restart
    assert await echo.run(target, ["key"], ["value-"]) == b"value-key"
    assert await echo.run(target, ["key"], [7]) == b"7key"  # loaded now: by SHA
    failing = Script("failing", "return redis.error_reply('refused on purpose')")
    with pytest.raises(ResponseError, match="refused on purpose"):
        await failing.run(target, [], [])


async def test_a_pipeline_loads_a_script_redis_lost_before_it_runs(aredis: Redis) -> None:
    """``Script.queue`` gives a redis-py pipeline the script to load (``Pipeline.scripts``,
    read by redis-py's ``load_scripts`` before it executes)."""
    echo = Script("echo", "return ARGV[1]")
    await aredis.script_flush()
    async with aredis.pipeline(transaction=False) as pipe:
        echo.queue(pipe, [], ["a"])
        echo.queue(pipe, [], ["b"])
        assert await pipe.execute() == [b"a", b"b"]


def test_every_script_is_sent_as_the_prelude_then_its_file_known_by_the_sha_of_both() -> None:
    folder = Path(lua.__file__).parent
    prelude = (folder / "prelude.lua").read_text()
    names = script_names()
    assert sorted(p.stem for p in folder.glob("*.lua") if p.stem != "prelude") == names
    for name in names:
        text = script(name).script
        assert text == f"{prelude}\n{(folder / f'{name}.lua').read_text()}"
        assert script(name).sha == hashlib.sha1(text.encode()).hexdigest()


async def test_load_scripts_loads_every_script_as_it_is_sent(aredis: Redis) -> None:
    await aredis.script_flush()
    await load_scripts(aredis)
    shas = [script(name).sha for name in script_names()]
    assert await aredis.script_exists(*shas) == [True] * len(shas)
