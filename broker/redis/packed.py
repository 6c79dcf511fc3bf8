"""A pipeline packed by hand for the streaming hot path: RESP built in one join, raw replies.

The worker's result writer sends one ``XADD`` per job per flush, and at a model's
usual token rate a flush holds about one token per job, so whatever a command costs is
paid per token. redis-py's ``Pipeline`` spends Python per command on encoding each
argument, a response callback and a time-out scope per reply (the cost is measured in
``docs/performance.md``, streaming hot path). This
pipeline packs its arguments as RESP directly and sends them in one write on a
lean connection of its own (``broker.redis.resp``), which hands back every reply as
Redis sent it.

An error reply comes back in its place as its exception, as with redis-py's
``execute(raise_on_error=False)``; a connection error or a round trip past
``resp.ROUND_TRIP_S`` drops the connection and propagates (``broker.redis.resp``). It
needs a single Redis server: a cluster client routes commands by slot and keeps
redis-py's pipeline.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from broker.redis.resp import Arg, RespLink, pack


class PackedPipeline:
    """Commands for one round trip; ``execute`` sends them and returns their replies."""

    def __init__(self, link: RespLink) -> None:
        self._link = link
        self._parts: list[bytes] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def execute_command(self, *args: Arg) -> None:
        self._parts.append(pack(*args))
        self._count += 1

    def xadd(self, name: str | bytes, fields: dict[bytes, bytes], id: bytes) -> None:
        """``XADD name id field value ...``, as redis-py's ``Pipeline.xadd`` takes it. The
        writer adds one per job per flush, so per token: packed in one format, not per
        argument."""
        key = name.encode() if isinstance(name, str) else name
        head = b"*%d\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
            3 + 2 * len(fields),
            len(key),
            key,
            len(id),
            id,
        )
        self._parts.append(head)
        for field, value in fields.items():
            self._parts.append(
                b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(field), field, len(value), value)
            )
        self._count += 1

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Arg) -> None:
        self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    async def execute(self, raise_on_error: bool = False) -> list[Any]:
        """Send every command in one write; the replies in order (errors as values)."""
        if not self._count:
            return []
        packed, count = b"".join(self._parts), self._count
        self._parts, self._count = [], 0
        replies = await self._link.round_trip(packed, count)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies
