"""The dispatcher's HTTP/1.1 client for engines' ``/metrics``: kept-alive connections, an
asyncio protocol, the response parsed by httptools.

A dispatcher reads every engine endpoint five times a second, hundreds of them in a
fleet, so a scrape must cost next to nothing. In a profile of the scraper on httpx (py-spy,
``docs/performance.md``, "Reading engines' /metrics") httpx, httpcore and anyio took over
half of a scrape's CPU once the page was filtered, and httpcore's pool looks at every
pooled connection on each request (``has_expired``), so one scrape cost more the more
endpoints there were. Here a scrape is one ``write``, the response fed to llhttp (the C
parser uvicorn uses) in the protocol's ``data_received``, and one future that ends when
the body is whole: no stream, no task of its own, no pool walk.

What it does: ``GET`` over connections kept alive between scrapes (one request at a time
on each; a pool per origin); the body whole, framed by Content-Length, chunked, or the
connection's end; one deadline per call, one timer per request; TLS for ``https`` (the
system's trust store, as the worker's engine client). It sends no ``Accept-Encoding``, so
the engine answers uncompressed: prometheus-client gzips a page for a client that asks
(httpx does), which costs the engine and the dispatcher CPU to save bytes on a loopback or
LAN hop. It asks for the text format (``Accept: text/plain``), not OpenMetrics.

Whatever goes wrong closes the connection, and the call raises ``FetchError`` saying why.
A kept-alive connection the server closed while it was idle (its keep-alive timeout
racing the scrape) is tried again once on a new connection, when nothing of the answer
came: a GET may be sent twice. What it does not do: redirects, proxies, cookies,
compression, HTTP/2.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

MAX_BODY_BYTES = 16 << 20  # a /metrics page is tens of KB; this bounds a misconfigured URL

_REQUEST = (
    b"GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: fairq-dispatcher\r\n"
    b"Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\n\r\n"
)


class FetchError(Exception):
    """A scrape got no whole response; the message says why (it ends up in the view)."""


class _NoAnswer(FetchError):
    """The connection closed before any byte of the answer: the request may be sent again."""


@dataclass(frozen=True)
class Page:
    status: int
    content_type: str  # as the server sent it, "" if none
    body: bytes


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    tls: bool
    request: bytes  # the whole request, sent as it is on every call


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"{url!r} is not an http(s) URL with a host")
    tls = parts.scheme == "https"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    netloc = parts.netloc.rpartition("@")[2]  # no credentials in the Host header
    port = parts.port or (443 if tls else 80)
    return _Target(parts.hostname, port, tls, _REQUEST % (path.encode(), netloc.encode()))


class _Connection(asyncio.Protocol):
    """One connection to an engine, carrying one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._done: asyncio.Future[Page] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    @property
    def idle(self) -> bool:
        return not self.closed and self._transport is not None and self._done is None

    def get(self, request: bytes, deadline: float, timeout_s: float) -> asyncio.Future[Page]:
        assert self._transport is not None and self._done is None
        # A parser and state per request: nothing of an earlier answer can leak into this one.
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._size = 0
        self._content_type = b""
        self._framed = False  # a Content-Length or chunked: the end is not the connection's
        self._headers_done = False
        self._answered = False  # a byte of the answer came
        done = self._done = self._loop.create_future()
        self._timer = self._loop.call_at(deadline, self._time_out, timeout_s)
        self._transport.write(request)
        return done

    def abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()
        self._end(FetchError("the scrape was abandoned"))

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._done is None:  # bytes nobody asked for: not a connection to reuse
            self.abort()
            return
        self._answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:  # a callback's own FetchError
            cause = exc.__context__
            self._end(cause if isinstance(cause, FetchError) else FetchError(str(exc)))
            self.abort()
        except httptools.HttpParserError as exc:
            self._end(FetchError(f"the response is not HTTP/1.1: {exc}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is None:
            return
        if not self._answered:
            self._end(_NoAnswer("the engine closed the connection without an answer"))
        elif self._headers_done and not self._framed:
            self._end(self._page())  # a body that ends with the connection (HTTP/1.0 style)
        else:
            reason = f": {exc}" if exc is not None else ""
            self._end(FetchError(f"the engine closed the connection mid-response{reason}"))

    # --- httptools callbacks ---

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-type":
            self._content_type = value
        elif lowered == b"content-length" or (
            lowered == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > MAX_BODY_BYTES:
            raise FetchError(f"the response is over {MAX_BODY_BYTES} bytes")
        self._body.append(piece)

    def on_message_complete(self) -> None:
        if self._done is None:
            return  # bytes after the answer, in its last piece: dropped with this parser
        if not self._parser.should_keep_alive() and self._transport is not None:
            self.closed = True
            self._transport.close()
        self._end(self._page())

    # --- inside ---

    def _page(self) -> Page:
        status = self._parser.get_status_code()
        return Page(status, self._content_type.decode("latin-1"), b"".join(self._body))

    def _time_out(self, timeout_s: float) -> None:
        self._timer = None
        self._end(FetchError(f"no answer within {timeout_s:g} s"))
        self.abort()

    def _end(self, outcome: Page | FetchError) -> None:
        """The request's end, good or bad; the connection is idle (or closed) after it."""
        done, self._done = self._done, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if done is None or done.done():
            return
        if isinstance(outcome, Page):
            done.set_result(outcome)
        else:
            done.set_exception(outcome)


class MetricsClient:
    """Kept-alive connections to engines (create and use it inside one event loop)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    def close(self) -> None:
        for pooled in self._idle.values():
            for conn in pooled:
                conn.abort()
        self._idle.clear()

    def drop(self, url: str) -> None:
        """Close the idle connections to ``url``'s origin (an endpoint no longer read)."""
        try:
            target = _target(url)
        except FetchError:
            return  # never connected
        for conn in self._idle.pop((target.host, target.port, target.tls), []):
            conn.abort()

    async def get(self, url: str, timeout_s: float) -> Page:
        """The response to ``GET url``, whole, within ``timeout_s`` (connecting included);
        raises ``FetchError``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        target = _target(url)
        origin = (target.host, target.port, target.tls)
        conn, reused = self._pooled(origin), True
        if conn is None:
            conn, reused = await self._connect(loop, target, deadline, timeout_s), False
        try:
            page = await conn.get(target.request, deadline, timeout_s)
        except _NoAnswer:
            if not reused:
                raise
            conn = await self._connect(loop, target, deadline, timeout_s)
            page = await self._call(conn, target, deadline, timeout_s)
        except BaseException:
            conn.abort()  # cancelled mid-response: the connection's state is unknown
            raise
        if conn.idle:
            self._idle.setdefault(origin, []).append(conn)
        return page

    async def _call(
        self, conn: _Connection, target: _Target, deadline: float, timeout_s: float
    ) -> Page:
        try:
            return await conn.get(target.request, deadline, timeout_s)
        except BaseException:
            conn.abort()
            raise

    def _pooled(self, origin: tuple[str, int, bool]) -> _Connection | None:
        pooled = self._idle.get(origin)
        while pooled:
            conn = pooled.pop()
            if conn.idle:
                return conn
        return None

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, target: _Target, deadline: float, timeout_s: float
    ) -> _Connection:
        tls = self._tls_context() if target.tls else None
        try:
            async with asyncio.timeout_at(deadline):
                _, conn = await loop.create_connection(
                    functools.partial(_Connection, loop),
                    target.host,
                    target.port,
                    ssl=tls,
                    server_hostname=target.host if tls else None,
                )
        except TimeoutError:
            raise FetchError(f"no answer within {timeout_s:g} s") from None
        except OSError as exc:
            raise FetchError(f"cannot connect: {exc}") from exc
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls
