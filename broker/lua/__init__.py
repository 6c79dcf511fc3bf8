"""The Lua contract: each script of this folder, with its typed call beside it, loaded one way.

``name.lua`` is a script, its header naming every ``KEYS[n]`` and ``ARGV[n]``; ``name.py``
is its typed call: ``name_call(...)`` takes what the script is given as typed parameters
and returns a ``Call`` (KEYS and ARGV in the header's order, ``decode`` for the reply: an
enum, a small dataclass or a plain value), which broker's stores ``run`` or ``queue`` into
a pipeline. Services never import this package (tests/test_architecture.py).

Redis scripts cannot include files: the Lua several scripts share lives once, as local
functions in ``prelude.lua``, put before every script when it is read. Redis runs, and
knows by its SHA, that one text, whatever sends it: ``Script.run`` over redis-py or the
lean connection, ``Script.queue``, ``load_scripts`` (every master of a cluster).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any, Generic, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError, ResponseError

from broker.redis.packed import PackedPipeline
from broker.redis.resp import Arg, RespLink

R = TypeVar("R")

_PRELUDE = "prelude"


def _read(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.lua").read_text()


class Script:
    """A script as Redis runs it: the prelude and the file, and the SHA of that text."""

    # ``script`` and ``sha`` are the names redis-py's pipeline reads to load a script it
    # was given (``queue``) before it executes.
    __slots__ = ("name", "script", "sha")

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.script = text
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    def run(
        self, target: Redis | RespLink, keys: Sequence[str], args: Sequence[Arg]
    ) -> Awaitable[Any]:
        """The reply, by SHA: over the lean connection when ``target`` is one, else through
        redis-py. A script Redis lost is loaded and called again; an error reply is raised.
        (Not a coroutine itself: the gateway's enqueue awaits one frame less.)"""
        if isinstance(target, RespLink):
            return self._run_packed(target, keys, args)
        return self._run_redis(target, keys, args)

    async def _run_redis(self, redis: Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            return await redis.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await redis.script_load(self.script)
            return await redis.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

    async def _run_packed(self, link: RespLink, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        for _ in range(2):
            pipe = PackedPipeline(link)
            pipe.evalsha(self.sha, len(keys), *keys, *args)
            [reply] = await pipe.execute()
            if not isinstance(reply, NoScriptError):
                break
            pipe.execute_command("SCRIPT", "LOAD", self.script)
            await pipe.execute(raise_on_error=True)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def queue(
        self, pipe: Pipeline | PackedPipeline, keys: Sequence[str], args: Sequence[Arg]
    ) -> None:
        """Add the call to ``pipe``, by SHA. A redis-py pipeline loads the script first if
        Redis lacks it (as redis-py's own scripts do); the packed pipeline and a cluster's
        leave a ``NOSCRIPT`` reply to their caller, which reloads (``load_scripts``)."""
        # The packed pipeline first: isinstance against redis-py's classes costs ~0.5 µs (a
        # Protocol in their bases), paid by every job's end on the workers' hot path.
        if type(pipe) is not PackedPipeline and isinstance(pipe, Pipeline):
            pipe.scripts.add(self)  # type: ignore[arg-type]  # it reads .sha and .script
        pipe.evalsha(self.sha, len(keys), *keys, *args)


@cache
def script(name: str) -> Script:
    """``name.lua`` with the prelude before it."""
    return Script(name, f"{_read(_PRELUDE)}\n{_read(name)}")


def script_names() -> list[str]:
    files = resources.files(__name__).iterdir()
    names = (p.name.removesuffix(".lua") for p in files if p.name.endswith(".lua"))
    return sorted(name for name in names if name != _PRELUDE)


async def load_scripts(redis: Any) -> None:
    """Load every script (on every master of a cluster)."""
    for name in script_names():
        await redis.script_load(script(name).script)


class Call(Generic[R]):
    """One call of a script: its KEYS and ARGV in the order of the script's header, and how
    its reply reads (``decode``, also for a reply a pipeline got)."""

    __slots__ = ("args", "decode", "keys", "script")

    def __init__(
        self, script: Script, keys: Sequence[str], args: Sequence[Arg], decode: Callable[[Any], R]
    ) -> None:
        self.script, self.keys, self.args, self.decode = script, keys, args, decode

    async def run(self, target: Redis | RespLink) -> R:
        return self.decode(await self.script.run(target, self.keys, self.args))

    def queue(self, pipe: Pipeline | PackedPipeline) -> None:
        self.script.queue(pipe, self.keys, self.args)


def one(reply: Any) -> bool:
    """A reply of 1 (yes) or 0 (no)."""
    return bool(reply == 1)
