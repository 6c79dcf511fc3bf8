"""The Lua contract: each script of this folder, with its typed call beside it, loaded one way.

``name.lua`` is the script, its header naming every ``KEYS[n]`` and ``ARGV[n]``;
``name.py`` is its call: a frozen dataclass whose fields are what the script is given,
whose ``keys()`` and ``args()`` list them in the header's order, and whose ``decode``
turns the reply into an enum, a small dataclass or a plain value. Broker's stores build
calls and run them; services never import this package (tests/test_architecture.py).

Redis scripts cannot include files, so the Lua that several scripts share lives once, as
local functions in ``prelude.lua``, and is put before every script when it is read: the
text Redis runs, and the SHA it knows the script by, are of prelude and script together.
That one text is what every path sends: ``Script.run`` over redis-py or the lean
connection (by SHA, loading it when Redis lacks it, e.g. after a restart),
``Script.queue`` into a pipeline, and ``load_scripts`` (every master of a cluster).
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any, ClassVar, Generic, TypeVar

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

    async def run(self, target: Redis | RespLink, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        """The reply, by SHA: over the lean connection when ``target`` is one, else through
        redis-py. A script Redis lost is loaded and called again; an error reply is raised."""
        if isinstance(target, RespLink):
            return await self._run_packed(target, keys, args)
        try:
            return await target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await target.script_load(self.script)
            return await target.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)

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
        if isinstance(pipe, Pipeline):
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


class Call(abc.ABC, Generic[R]):
    """One call of a script; a subclass is a frozen dataclass of what the script is given."""

    __slots__ = ()
    script: ClassVar[Script]

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """KEYS, in the order of the script's header."""

    @abc.abstractmethod
    def args(self) -> list[Arg]:
        """ARGV, in the order of the script's header."""

    @abc.abstractmethod
    def decode(self, reply: Any) -> R:
        """The script's reply as Python values."""

    async def run(self, target: Redis | RespLink) -> R:
        return self.decode(await self.script.run(target, self.keys(), self.args()))

    def queue(self, pipe: Pipeline | PackedPipeline) -> None:
        """Add the call to ``pipe``; ``decode`` its reply once the pipeline ran."""
        self.script.queue(pipe, self.keys(), self.args())
