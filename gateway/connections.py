"""The gateway's HTTP connections, held to limits that a slow or hostile client cannot stretch.

uvicorn reads a request's headers and body for as long as a client takes, keeps any
number of connections open, and closes a socket that still has unread bytes, which
resets the connection under a client that is still sending. ``GuardedProtocol`` is
uvicorn's httptools protocol with these limits (``broker.settings.HttpSettings``):

* headers: all of them within ``header_timeout_s`` of the connection, or of a keep-alive
  request's first byte; else 408 and closed (closed without a word if nothing came);
* header size: the request line and headers within ``MAX_HEADER_BYTES``, before any
  route (or key) sees them; else 431 and closed. Headers still arriving past the cap
  are not parsed on: what follows is dropped (up to ``discard_body_bytes``, until the
  header deadline), so the parser holds at most the cap and one read;
* body: no silence longer than ``body_timeout_s`` while one arrives; else 408 and closed.
  A silence while uvicorn has paused reading (the app has not taken what came) is the
  gateway's own and does not count;
* connections: one beyond ``max_connections`` reads its request, gets a 503 and is closed;
* a body that arrives after its answer (a 413 sent on the declared length, that 503) is
  read and dropped, up to ``discard_body_bytes``, so that a client that sends all of its
  body before it reads still gets the answer; the connection stays usable after a 413;
* an idle keep-alive connection is closed after ``keep_alive_s`` (uvicorn's own timer,
  set in ``server.gateway_config``; this protocol arms it after a dropped body, whose
  reads cancelled uvicorn's).

One timer per connection enforces the three deadlines: it is armed when a request starts
and, when it fires, either closes the connection or re-arms itself for what is left, so
that a read costs one clock reading and no timer.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from broker.settings import HttpSettings

log = logging.getLogger(__name__)

# File descriptors a gateway needs beyond its HTTP connections: Redis pools, the result
# reader, logs, and connections accepted beyond the cap until they are answered.
_FD_HEADROOM = 1024

# The request line and headers of one request, together. The largest legitimate set (an
# API key and a few tracing headers) is a few KiB; httptools and uvicorn keep whatever
# comes until the headers end, with no bound of their own (uvicorn bounds only its h11
# protocol, with h11_max_incomplete_event_size; the gateway always runs this one).
MAX_HEADER_BYTES = 64 * 1024


class _Phase(enum.Enum):
    HEADERS = "headers"  # a request's headers are due
    BODY = "body"  # its body is arriving
    DONE = "done"  # read whole: the app answers; uvicorn's keep-alive timer takes over
    IDLE = "idle"  # read whole after its answer was sent: this protocol's keep-alive
    OVERSIZED = "oversized"  # headers past the cap, answered 431: input dropped unparsed


def _answer(status: str, kind: str, code: str, message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP response with an OpenAI error body, written without the app."""
    body = orjson.dumps({"error": {"message": message, "type": kind, "code": code}})
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    ).encode()
    return head + extra + b"\r\n" + body


_HEADERS_TOO_LARGE = _answer(
    "431 Request Header Fields Too Large",
    "invalid_request_error",
    "headers_too_large",
    f"the request line and headers exceed {MAX_HEADER_BYTES} bytes, this gateway's limit; "
    "send fewer or shorter headers",
)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``limits`` (a subclass per settings:
    ``guarded_protocol``)."""

    limits: ClassVar[HttpSettings]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _Phase.HEADERS
        self._since = 0.0  # when the headers became due
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._begun = False  # a byte of a request has come on this connection
        self._refused = False  # answered without the app: beyond max_connections, or 431
        self._discarded = 0
        self._header_bytes = 0  # read while this request's headers are due

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._since = self._last_read = self.loop.time()
        self._refused = len(self.connections) > self.limits.max_connections
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_read = self.loop.time()
        if self._phase is _Phase.OVERSIZED:
            self._discard(len(data))
            return
        if self._phase is _Phase.HEADERS:
            self._header_bytes += len(data)
        super().data_received(data)
        # Checked once the parser has the read: a read that ends the headers may hold body
        # bytes, which do not count (``on_headers_complete`` measures those headers whole).
        if self._phase is _Phase.HEADERS and self._header_bytes > MAX_HEADER_BYTES:
            self._phase = _Phase.OVERSIZED
            self.transport.write(_HEADERS_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begun = True
        self._discarded = 0
        if self._phase is not _Phase.HEADERS:  # a keep-alive request: its headers are due
            self._phase, self._since = _Phase.HEADERS, self.loop.time()
            self._arm(self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._phase, self._header_bytes = _Phase.BODY, 0
        if self._refused:
            self.transport.write(self._over_capacity())
            return
        if self._header_size() > MAX_HEADER_BYTES:  # as the 503: body dropped, then closed
            self._refused = True
            self.transport.write(_HEADERS_TOO_LARGE)
            return
        super().on_headers_complete()

    def _header_size(self) -> int:
        return len(self.url) + sum(len(name) + len(value) for name, value in self.headers)

    def on_body(self, body: bytes) -> None:
        if self._refused or (self.cycle is not None and self.cycle.response_complete):
            self._discard(len(body))
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            self._phase = _Phase.DONE
            self.transport.close()  # the whole request is read: no reset under the client
            return
        answered = self.cycle is not None and self.cycle.response_complete
        super().on_message_complete()
        # Answered before its body ended: the body's reads cancelled uvicorn's keep-alive
        # timer, which uvicorn arms only when a response completes.
        self._phase = _Phase.IDLE if answered else _Phase.DONE
        if answered:
            self._arm(self.limits.keep_alive_s)

    def _discard(self, size: int) -> None:
        self._discarded += size
        if self._discarded > self.limits.discard_body_bytes:
            self.transport.close()

    def _arm(self, delay_s: float) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(delay_s, self._check)

    def _check(self) -> None:
        """The timer: close the connection past its deadline, else wait for the rest."""
        self._timer = None
        now = self.loop.time()
        if self._phase in (_Phase.HEADERS, _Phase.OVERSIZED):
            deadline = self._since + self.limits.header_timeout_s
        elif self._phase is _Phase.BODY:
            if self.flow.read_paused:  # not reading is the gateway's doing, not the client's
                self._last_read = now
            deadline = self._last_read + self.limits.body_timeout_s
        elif self._phase is _Phase.IDLE:
            deadline = self._last_read + self.limits.keep_alive_s
        else:
            return
        if now < deadline:
            self._arm(deadline - now)
        elif not self.transport.is_closing():
            self._time_out()

    def _time_out(self) -> None:
        # A request answered without the app (503, 431) gets no second answer.
        answered = self._phase is _Phase.OVERSIZED or (self._refused and self._phase is _Phase.BODY)
        silent = answered or self._phase is _Phase.IDLE or not self._begun
        cycle = self.cycle if self._phase is _Phase.BODY and not self._refused else None
        if not silent and not (cycle is not None and cycle.response_started):
            if cycle is not None:  # the app, still waiting for the body, answers no one
                cycle.disconnected = True
            if self._phase is _Phase.HEADERS:
                what, limit = "headers", self.limits.header_timeout_s
            else:
                what, limit = "body", self.limits.body_timeout_s
            message = f"the request {what} did not arrive in time ({limit:g} s)"
            self.transport.write(
                _answer("408 Request Timeout", "invalid_request_error", "request_timeout", message)
            )
        self.transport.close()

    def _over_capacity(self) -> bytes:
        message = (
            f"this gateway holds {self.limits.max_connections} connections, its limit; "
            "retry shortly"
        )
        return _answer(
            "503 Service Unavailable",
            "server_error",
            "too_many_connections",
            message,
            b"retry-after: 1\r\n",
        )


def guarded_protocol(limits: HttpSettings) -> type[GuardedProtocol]:
    """The protocol class to give uvicorn (``http=``) for these limits."""
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})


def make_room(limits: HttpSettings) -> None:
    """Raise this process's limit on open files to what ``max_connections`` needs, where
    the hard limit allows. Past the limit ``accept`` fails and asyncio stops accepting for
    a second at a time, and Redis connections fail as well: every client would suffer."""
    needed = limits.max_connections + _FD_HEADROOM
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        log.warning(
            "open files are limited to %d: fewer than http.max_connections (%d) + %d; "
            "raise the limit (ulimit -n) or lower http.max_connections",
            target,
            limits.max_connections,
            _FD_HEADROOM,
        )
