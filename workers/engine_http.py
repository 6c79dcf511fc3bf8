"""The worker's HTTP/1.1 client for engines: an asyncio protocol, parsed by httptools.

Every streamed token crosses this client, so it is built for that. The response
is parsed by httptools (llhttp, the C parser uvicorn uses) inside the protocol's
``data_received``, and each piece of body goes to the caller's ``on_body`` in
that same call: a token costs no task switch, no future and no timer. (aiohttp,
the client before, woke the reading task and re-armed its read timer for every
chunk; see docs/performance.md for the figures side by side.)

What it does: ``POST`` with a body, connections kept alive and reused per origin
(dropped after ``KEEPALIVE_S`` idle, below the engine's own keep-alive), one
request per connection at a time, a connect timeout, and an idle timeout that
bounds the silence between two pieces of the response: one timer per request,
re-armed only when it fires. What it does not do: redirects, proxies, cookies,
compression, HTTP/2. An engine endpoint is an http(s) URL the operator wrote
into the configuration, and vLLM answers plain HTTP/1.1.

Errors are typed (``HttpClientError`` and its subclasses); ``workers.engine``
turns them into ``EngineError`` with the client-facing code.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

# Below the engine's own keep-alive (uvicorn's, and so vLLM's, is 5 s): a pooled
# connection is dropped here before the server may close it under a new request.
KEEPALIVE_S = 4.0

_REQUEST_HEAD = (
    b"POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: fairq-worker\r\n"
    b"Content-Type: application/json\r\nAccept: text/event-stream, application/json\r\n"
    b"Content-Length: %d\r\n\r\n"
)


class HttpClientError(Exception):
    """Root of the engine client's errors: the call did not get a whole response."""


class ConnectFailed(HttpClientError):
    """No connection to the engine (refused, unresolvable, or the connect timed out)."""


class SilenceTimeout(HttpClientError):
    """The engine sent nothing for the idle timeout: a hang."""


class ConnectionBroke(HttpClientError):
    """The connection closed or reset before the response was complete."""


class BadResponse(HttpClientError):
    """The engine's bytes are not an HTTP response."""


@dataclass(frozen=True)
class Target:
    """Where a URL's request goes: connection parameters and the request line's parts."""

    host: str
    port: int
    tls: bool
    host_header: bytes
    path: bytes

    @property
    def origin(self) -> tuple[str, int, bool]:
        return self.host, self.port, self.tls


@functools.lru_cache(maxsize=1024)
def target_of(url: str) -> Target:
    """Parse an engine URL once (a worker calls a handful of them, over and over)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectFailed(f"{url!r} is not an http(s) URL with a host")
    tls = parts.scheme == "https"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    netloc = parts.netloc.rpartition("@")[2]  # no credentials in the Host header
    port = parts.port or (443 if tls else 80)
    return Target(parts.hostname, port, tls, netloc.encode(), path.encode())


def _header_lines(headers: Mapping[str, str] | None) -> bytes:
    if not headers:
        return b""
    for name, value in headers.items():
        if any(c in f"{name}{value}" for c in "\r\n"):  # would split the request
            raise ValueError(f"header {name!r} holds a line break")
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode()


@dataclass(frozen=True)
class Reply:
    """A finished call: its status, and its body unless ``on_body`` took it (status 200)."""

    status: int
    body: bytes = b""


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an engine, carrying one request at a time."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self._done: asyncio.Future[Reply] | None = None
        self._on_body: Callable[[bytes], None] | None = None
        self._on_headers: Callable[[int], None] | None = None
        self._status = 0
        self._error_body = bytearray()
        self._idle_s = 0.0
        self._last_data = 0.0
        self._watchdog: asyncio.TimerHandle | None = None

    @property
    def reusable(self) -> bool:
        return not self._closed and self._transport is not None and self._done is None

    def request(
        self,
        head_and_body: bytes,
        idle_s: float,
        on_body: Callable[[bytes], None],
        on_headers: Callable[[int], None] | None,
    ) -> asyncio.Future[Reply]:
        """Send one request; the future ends with the reply or the call's error."""
        assert self._transport is not None and self._done is None
        self._done = self._loop.create_future()
        self._on_body, self._on_headers, self._idle_s = on_body, on_headers, idle_s
        self._last_data = self._loop.time()
        self._watchdog = self._loop.call_at(self._last_data + idle_s, self._check_silence)
        self._transport.write(head_and_body)
        return self._done

    def abort(self) -> None:
        """Close at once (the engine sees the client go and stops the request)."""
        self._closed = True
        if self._transport is not None:
            self._transport.abort()
        self._fail(ConnectionBroke("the request was abandoned"))

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._done is None:  # bytes on an idle connection: the server is not HTTP/1.1-clean
            self.abort()
            return
        self._last_data = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # on_body raised: the caller's error
            self._fail(exc.__context__ or exc)
            self.abort()
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"the engine's response is not valid HTTP: {exc}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        reason = f": {exc!r}" if exc is not None else ""
        self._fail(ConnectionBroke(f"the engine closed the connection mid-response{reason}"))

    # --- httptools callbacks ---

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        if self._on_headers is not None:
            self._on_headers(self._status)

    def on_body(self, piece: bytes) -> None:
        if self._status == 200:
            assert self._on_body is not None
            self._on_body(piece)
        else:
            self._error_body += piece

    def on_message_complete(self) -> None:
        done = self._done
        reply = Reply(self._status, bytes(self._error_body))
        keep = self._parser.should_keep_alive()
        self._stop_watchdog()
        self._reset()
        if not keep:
            self._closed = True
            if self._transport is not None:
                self._transport.close()
        self.idle_since = self._loop.time()
        if done is not None and not done.done():
            done.set_result(reply)

    # --- inside ---

    def _check_silence(self) -> None:
        deadline = self._last_data + self._idle_s
        if self._loop.time() < deadline:  # data came since: look again at the new deadline
            self._watchdog = self._loop.call_at(deadline, self._check_silence)
            return
        self._watchdog = None
        self._fail(SilenceTimeout(f"the engine sent nothing for {self._idle_s:g}s"))
        self.abort()

    def _stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _fail(self, exc: BaseException) -> None:
        done = self._done
        self._stop_watchdog()
        if done is not None and not done.done():
            done.set_exception(exc)


class EngineClient:
    """Pooled HTTP/1.1 connections to engines (create and use it inside one event loop)."""

    def __init__(
        self,
        connect_timeout_s: float,
        keepalive_s: float = KEEPALIVE_S,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """``headers`` go out with every request (the engine's API key), rendered once."""
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._own_head = _header_lines(headers)
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()

    @property
    def pooled(self) -> int:
        """Idle connections a call could take now (the server has not closed them)."""
        return sum(conn.reusable for conns in self._idle.values() for conn in conns)

    def close(self) -> None:
        for pooled in self._idle.values():
            for conn in pooled:
                conn.abort()
        self._idle.clear()

    async def post(
        self,
        url: str,
        body: bytes,
        *,
        idle_timeout_s: float,
        on_body: Callable[[bytes], None],
        on_headers: Callable[[int], None] | None = None,
        on_written: Callable[[], None] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """POST ``body`` (JSON) to ``url``; the body of a 200 goes to ``on_body`` piece by piece.

        ``on_body`` runs inside the protocol's callback: it must not block, and an
        exception it raises ends the call (the connection is closed) and is raised
        here. ``on_headers`` is called with the status when the response's headers arrived,
        ``on_written`` once the request is handed to the socket. ``headers`` go out
        beside the client's own (an API key, for callers other than the worker). A
        cancelled call closes its connection, which tells the engine to stop.
        """
        target = target_of(url)
        conn = await self._connection(target)
        head = _REQUEST_HEAD % (target.path, target.host_header, len(body))
        extra = self._own_head + _header_lines(headers)
        if extra:
            head = head[:-2] + extra + b"\r\n"
        done = conn.request(head + body, idle_timeout_s, on_body, on_headers)
        if on_written is not None:
            on_written()
        try:
            reply = await done
        except BaseException:
            conn.abort()
            raise
        if conn.reusable:
            self._idle.setdefault(target.origin, []).append(conn)
        return reply

    async def _connection(self, target: Target) -> _Connection:
        pooled = self._idle.get(target.origin)
        now = asyncio.get_running_loop().time()
        while pooled:
            conn = pooled.pop()  # the most recently used: the least likely to be stale
            if conn.reusable and now - conn.idle_since < self._keepalive_s:
                return conn
            conn.abort()
        return await self._connect(target)

    async def _connect(self, target: Target) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if target.tls else None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    _Connection,
                    target.host,
                    target.port,
                    ssl=tls,
                    server_hostname=target.host if tls else None,
                )
        except (OSError, TimeoutError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
