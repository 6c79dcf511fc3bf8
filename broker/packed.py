"""A pipeline packed by hand for the streaming hot path: RESP built in one join, raw replies.

The worker's result writer sends one ``XADD`` per job per flush, and at ~50 tokens/s
per stream a flush holds about one token per job, so whatever a command costs is
paid per token. redis-py's ``Pipeline`` spends about 10 µs of Python per command:
encoding each argument, a response callback and a time-out scope per reply. This
pipeline packs its arguments as RESP directly, sends them in one write on a
connection of the client's own pool and reads every reply as Redis sent it.

An error reply comes back in its place as its exception, as with redis-py's
``execute(raise_on_error=False)``; a connection error, a round trip past
``ROUND_TRIP_S`` or a cancellation drops the connection (its replies are unread)
and propagates. It needs a single Redis server: a cluster client routes commands
by slot and keeps redis-py's pipeline.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# The bound on one round trip: fairq's clients have no per-command socket time-out
# (``broker.redis_conn``), so the pipeline bounds its send and all its replies at once.
ROUND_TRIP_S = 10.0

Arg = bytes | str | int | float


def _bulk(value: Arg) -> bytes:
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, int):
        value = b"%d" % value
    elif isinstance(value, float):
        value = repr(value).encode()  # as redis-py encodes a float
    return b"$%d\r\n%s\r\n" % (len(value), value)


class PackedPipeline:
    """Commands for one round trip; ``execute`` sends them and returns their replies."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._parts: list[bytes] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def execute_command(self, *args: Arg) -> None:
        self._parts.append(b"*%d\r\n" % len(args))
        self._parts.extend(map(_bulk, args))
        self._count += 1

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Arg) -> None:
        self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    async def execute(self, raise_on_error: bool = False) -> list[Any]:
        """Send every command in one write; the replies in order (errors as values)."""
        if not self._count:
            return []
        packed, count = b"".join(self._parts), self._count
        self._parts, self._count = [], 0
        try:
            async with asyncio.timeout(ROUND_TRIP_S):
                replies = await self._round_trip(packed, count)
        except TimeoutError:
            message = f"Redis did not answer a pipeline within {ROUND_TRIP_S:.0f} s"
            raise RedisTimeoutError(message) from None
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return replies

    async def _round_trip(self, packed: bytes, count: int) -> list[Any]:
        pool = self._redis.connection_pool
        connection = await pool.get_connection()  # connects if need be
        try:
            await connection.send_packed_command(packed, check_health=False)
            return [await _reply(connection) for _ in range(count)]
        except BaseException:
            await connection.disconnect()  # replies may be left unread on it
            raise
        finally:
            await pool.release(connection)


async def _reply(connection: Any) -> Any:
    try:
        return await connection.read_response(disable_decoding=True)
    except ResponseError as error:  # the reply was read whole: the next one follows
        return error
