"""Loads the Lua scripts of ``broker/lua/`` and binds them to a Redis client.

Each script is registered once per client; redis-py then calls it by SHA and
reloads it transparently after a Redis restart (NOSCRIPT).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript


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
