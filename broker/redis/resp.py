"""A lean Redis connection for the streaming hot path: an asyncio protocol, replies by hiredis.

The result writer sends one pipeline per flush and needs every reply back, in order,
as Redis sent them; the result reader sends one XREAD after another. redis-py's
connection reads each reply through a chain of coroutines over an
``asyncio.StreamReader`` and, with a health-check interval, asks for the running
loop once per reply (a ``getpid()`` system call on Python 3.11). The writer gets
about one reply per streamed token, so these costs are paid per token (measured in
``docs/performance.md``, streaming hot path). It is an ``asyncio.Protocol``: its ``data_received``
feeds hiredis (the C parser redis-py uses too) and collects the replies, and one
future per round trip ends when the last one is in.

What it does: ``redis://``, ``rediss://`` (TLS, with redis-py's URL options) and
``unix://`` URLs, ``AUTH`` and ``SELECT`` from the URL, TCP keepalive, round trips
pipelined from any number of tasks (replies go back in the order asked), each
bounded by ``ROUND_TRIP_S``. RESP2 only. The bound costs a round trip no timer of its
own (a time-out scope costs a timer and three loop look-ups, each a ``getpid()``
on Python 3.11): the connection keeps one watchdog timer, armed at the
earliest deadline of the round trips waiting and re-armed only when it fires or a
round trip with an earlier deadline comes. An error reply comes back in its place as
a redis-py ``ResponseError`` (``NoScriptError`` for ``NOSCRIPT``), so callers
handle errors as they would with redis-py. Whatever breaks the connection (a
reset, no answer in time, bytes that are not RESP) closes it and raises a
redis-py ``ConnectionError`` or ``TimeoutError`` in every round trip on it: their
replies are unknown, so it is never used again, and ``RespLink`` opens a new one
on the next call.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from typing import Any, cast

import hiredis
from redis.asyncio.connection import RedisSSLContext, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

# The bound on one round trip, and on setting up a connection: the hot path's clients have
# no per-command socket time-out (``broker.redis.connect``), so each round trip bounds itself.
ROUND_TRIP_S = 10.0

_MORE = object()  # hiredis: no whole reply in the buffer yet


def _reply_error(message: str) -> ResponseError:
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    return ResponseError(message)


class _RoundTrip:
    """Commands sent in one write, waiting for their replies until ``deadline``."""

    __slots__ = ("bound_s", "count", "deadline", "done", "replies")

    def __init__(
        self, done: asyncio.Future[list[Any]], count: int, bound_s: float, deadline: float
    ) -> None:
        self.done = done
        self.count = count
        self.bound_s = bound_s
        self.deadline = deadline
        self.replies: list[Any] = []


class _RespProtocol(asyncio.Protocol):
    """One connection's bytes in and out. Round trips may overlap: Redis answers in the
    order it was asked, so the replies go to the round trips in the order they were sent."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader(replyError=_reply_error, notEnoughData=_MORE)
        # Looked up once: on Python 3.11 ``get_running_loop`` costs a getpid() system call.
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._waiting: deque[_RoundTrip] = deque()
        self._watchdog: asyncio.TimerHandle | None = None
        self._watch_at = 0.0  # when the watchdog fires (if armed)
        self.broken: BaseException | None = None

    def send(self, packed: bytes, count: int, bound_s: float) -> asyncio.Future[list[Any]]:
        """Write ``count`` packed commands; the future ends with their replies, or with a
        ``TimeoutError`` that closes the connection if they are not all in within
        ``bound_s``."""
        assert self._transport is not None
        if self.broken is not None:
            raise RedisConnectionError(f"the Redis connection is closed: {self.broken}")
        done: asyncio.Future[list[Any]] = self._loop.create_future()
        deadline = self._loop.time() + bound_s
        self._waiting.append(_RoundTrip(done, count, bound_s, deadline))
        if self._watchdog is None or deadline < self._watch_at:
            self._arm(deadline)
        self._transport.write(packed)
        return done

    def close(self, reason: BaseException | None = None) -> None:
        self._fail(reason or RedisConnectionError("the connection was closed by fairq"))
        if self._transport is not None:
            self._transport.abort()

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        try:
            self._hand_out(self._reader.gets)
        except hiredis.ProtocolError as exc:
            self._fail(RedisConnectionError(f"Redis sent bytes that are not RESP: {exc}"))
            self.close()

    def _hand_out(self, gets: Any) -> None:
        """Every whole reply to the round trip it belongs to, oldest first."""
        waiting = self._waiting
        while waiting:
            trip = waiting[0]
            replies = trip.replies
            while len(replies) < trip.count:
                reply = gets()
                if reply is _MORE:
                    return
                replies.append(reply)
            waiting.popleft()
            if not trip.done.done():  # a caller that gave up: its replies are dropped
                trip.done.set_result(replies)
        if gets() is not _MORE:  # RESP2 servers send nothing unasked
            self._fail(RedisConnectionError("Redis sent a reply nobody asked for"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc is not None else ""
        self.broken = self.broken or RedisConnectionError(f"Redis closed the connection{reason}")
        self._fail(self.broken)

    def _fail(self, exc: BaseException) -> None:
        self.broken = self.broken or exc
        self._disarm()
        waiting, self._waiting = self._waiting, deque()
        for trip in waiting:
            if not trip.done.done():
                trip.done.set_exception(exc)

    # --- the watchdog: one timer for every round trip's bound ---

    def _arm(self, when: float) -> None:
        self._disarm()
        self._watch_at = when
        self._watchdog = self._loop.call_at(when, self._check_deadlines)

    def _disarm(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _check_deadlines(self) -> None:
        """Close the connection if a round trip is past its bound; else wait for the next."""
        self._watchdog = None
        if not self._waiting:
            return  # the round trips it was armed for are answered: the next send arms it
        late = min(self._waiting, key=lambda trip: trip.deadline)
        if late.deadline > self._loop.time():
            self._arm(late.deadline)
            return
        self.close(RedisTimeoutError(f"Redis did not answer within {late.bound_s:.1f} s"))


Arg = bytes | str | int | float


def bulk(value: Arg) -> bytes:
    """One argument in RESP, encoded as redis-py encodes it."""
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, int):
        value = b"%d" % value
    elif isinstance(value, float):
        value = repr(value).encode()  # as redis-py encodes a float
    return b"$%d\r\n%s\r\n" % (len(value), value)


def pack(*args: Arg) -> bytes:
    """One command in RESP."""
    return b"*%d\r\n" % len(args) + b"".join(map(bulk, args))


async def _open(url: str, bound_s: float) -> _RespProtocol:
    """Connect and authenticate as the URL says (redis-py's URL syntax and options)."""
    options = cast(dict[str, Any], parse_url(url))
    loop = asyncio.get_running_loop()
    if "path" in options:
        _, protocol = await loop.create_unix_connection(_RespProtocol, options["path"])
    else:
        host, port = options.get("host", "localhost"), options.get("port", 6379)
        tls = _tls_context(options) if url.startswith("rediss://") else None
        transport, protocol = await loop.create_connection(
            _RespProtocol, host, port, ssl=tls, server_hostname=host if tls else None
        )
        _keepalive(transport.get_extra_info("socket"))
    handshake = []
    if options.get("password"):
        auth = [options["username"]] if options.get("username") else []
        handshake.append(pack("AUTH", *auth, options["password"]))
    if options.get("db"):
        handshake.append(pack("SELECT", int(options["db"])))
    try:
        replies = (
            await protocol.send(b"".join(handshake), len(handshake), bound_s) if handshake else []
        )
    except BaseException:  # timed out or cancelled: the caller never gets this connection
        protocol.close()
        raise
    for reply in replies:
        if isinstance(reply, ResponseError):
            protocol.close()
            raise reply
    return protocol


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    """The context redis-py would build from the URL's ``ssl_*`` options."""
    names = set(RedisSSLContext.__slots__) - {"context"}
    wanted = {k[4:]: v for k, v in options.items() if k.startswith("ssl_") and k[4:] in names}
    return RedisSSLContext(**wanted).get()


def keepalive_options() -> dict[int, int]:
    """TCP keepalive probes that find a dead Redis host within ~25 s, and a bound of 30 s on
    data Redis never acknowledges (where the platform has these options)."""
    wanted = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 30_000}
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


def _keepalive(sock: socket.socket | None) -> None:
    """Find a dead Redis host within ~25 s (as ``broker.redis.connect`` does for redis-py)."""
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in keepalive_options().items():
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


class RespLink:
    """One lean connection to Redis, opened on first use and again after any failure.

    Any number of tasks may use it at once: their round trips are pipelined on the one
    connection, and each gets its own replies. A caller that is cancelled leaves the
    connection as it is (its replies are dropped when they come), so one client that
    goes away does not fail the calls of others. A blocking command (``XREAD BLOCK``)
    holds up every call behind it: a link that carries one has no other caller.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._protocol: _RespProtocol | None = None
        self._opening = asyncio.Lock()  # one connection, however many callers find none

    async def round_trip(
        self, packed: bytes, count: int, timeout_s: float | None = None
    ) -> list[Any]:
        """Send ``count`` packed commands in one write; their replies in order (errors
        as ``ResponseError`` values). Raises redis-py's ``ConnectionError`` or
        ``TimeoutError`` when the connection failed (it is closed then, and every
        round trip on it fails). The round trip is bounded by ``timeout_s``
        (``ROUND_TRIP_S`` if None), and so is connecting, when there is no connection."""
        bound_s = ROUND_TRIP_S if timeout_s is None else timeout_s
        protocol = self._protocol
        if protocol is None or protocol.broken is not None:
            protocol = await self._connected(bound_s)
        return await protocol.send(packed, count, bound_s)

    async def _connected(self, bound_s: float) -> _RespProtocol:
        """A new connection (the last one broke, or there was none), within ``bound_s``."""
        try:
            async with asyncio.timeout(bound_s), self._opening:
                if self._protocol is None or self._protocol.broken is not None:
                    self._protocol = await _open(self._url, bound_s)
                return self._protocol
        except TimeoutError:
            message = f"Redis did not answer within {bound_s:.1f} s"
            self.close(RedisTimeoutError(message))
            raise RedisTimeoutError(message) from None
        except OSError as exc:
            self.close()
            raise RedisConnectionError(f"cannot reach Redis: {exc}") from exc

    def close(self, reason: BaseException | None = None) -> None:
        """Drop the connection; round trips still on it fail with ``reason``."""
        if self._protocol is not None:
            self._protocol.close(reason)
            self._protocol = None
