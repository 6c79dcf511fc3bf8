"""Loads the Lua scripts of ``broker/lua/`` and binds them to a Redis client.

Each script is registered once per client; redis-py then calls it by SHA and
reloads it transparently after a Redis restart (NOSCRIPT). ``run_script`` calls one
over a lean connection (``broker.redis.resp``) the same way, for the scripts every
request runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["Scripts", "load_scripts", "run_script", "source"]

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from broker.lua import load_scripts, script
from broker.redis.packed import PackedPipeline
from broker.redis.resp import Arg, RespLink


def source(name: str) -> str:
    return script(name).script


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
    park: AsyncScript
    position: AsyncScript
    unseen: AsyncScript

    @classmethod
    def bind(cls, redis: Redis) -> Scripts:
        return cls(
            **{name: redis.register_script(source(name)) for name in cls.__dataclass_fields__}
        )


async def run_script(
    script: AsyncScript, keys: Sequence[str], args: Sequence[Arg], link: RespLink | None
) -> Any:
    """``script``'s reply: over ``link`` when there is one (by SHA, loaded first if Redis
    lost it after a restart, as redis-py does), else through redis-py. An error reply is
    raised, as redis-py raises it."""
    if link is None:
        return await script(keys=keys, args=args)
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
