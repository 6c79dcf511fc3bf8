"""Loads the Lua scripts of ``broker/lua/`` and binds them to a Redis client.

Each script is registered once per client; redis-py then calls it by SHA and
reloads it transparently after a Redis restart (NOSCRIPT). ``run_on`` calls one
over a lean connection (``broker.resp``) the same way, for the scripts every
request runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, cast

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from broker.packed import Arg, PackedPipeline
from broker.resp import RespLink


@cache
def source(name: str) -> str:
    return resources.files("broker").joinpath("lua", f"{name}.lua").read_text()


@dataclass(frozen=True)
class Scripts:
    enqueue: AsyncScript
    dispatch: AsyncScript
    start: AsyncScript
    complete: AsyncScript
    cancel: AsyncScript
    first: AsyncScript
    grant: AsyncScript
    lease: AsyncScript
    position: AsyncScript
    unseen: AsyncScript

    @classmethod
    def bind(cls, redis: Redis) -> Scripts:
        return cls(
            **{name: redis.register_script(source(name)) for name in cls.__dataclass_fields__}
        )


async def run_on(
    link: RespLink, script: AsyncScript, keys: Sequence[Arg], args: Sequence[Arg]
) -> Any:
    """``script``'s reply, called by SHA over ``link``; loaded first if Redis lost it (a
    restart), as redis-py does. An error reply is raised, as redis-py raises it."""
    for _ in range(2):
        pipe = PackedPipeline(link)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        [reply] = await pipe.execute()
        if not isinstance(reply, NoScriptError):
            break
        pipe.execute_command("SCRIPT", "LOAD", cast(str, script.script))  # ``source``: text
        await pipe.execute(raise_on_error=True)
    if isinstance(reply, ResponseError):
        raise reply
    return reply
