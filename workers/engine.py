"""Talking to an engine over HTTP: send one job's payload, hand back its output.

Streamed responses pass through as bytes: the reader cuts the byte stream at
event boundaries and only looks inside the few events that accounting needs
(the usage chunk and the one with a finish reason), found with a byte search,
so a token costs no JSON parsing here. ``data: [DONE]`` is dropped: the
gateway ends every stream itself, after the job's end is recorded.

Every way an engine can fail becomes an ``EngineError``: an error status (its
reason passed on), no connection, silence past the timeout (a hang), a stream
that ends without ``[DONE]`` (cut off), an error event inside the stream, and
malformed events. The last is checked by counting event boundaries, which costs
no parsing: raw newlines cannot occur inside JSON, so each ``\\n\\n`` ends an
event, and a well-formed one is ``data: {...}`` or ``data: [DONE]``. Only a
piece that fails the count (an SSE comment, ``data:`` without the space) is
looked at event by event.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
import orjson

from broker import Settings
from workers.errors import EngineError

_DONE = b"data: [DONE]\n\n"
_FINISH = re.compile(rb'"finish_reason":"([A-Za-z_]+)"')
_USAGE_MARK = b'"usage":{'
_ERROR_EVENTS = (b'data: {"error"', b'data: {"object":"error"')


@dataclass
class Accounting:
    """What the worker records about a response besides passing it on."""

    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    done: bool = False  # the stream's [DONE] arrived: the response is whole
    failure: EngineError | None = None  # a bad or error event ended the stream (see scan)

    def scan(self, events: bytes, keep_usage: bool) -> bytes:
        """Note usage and finish reason; return the events to forward.

        A malformed or error event sets ``failure``: the events before it (they may
        have come in the same read) are returned to be forwarded, then the caller
        raises it; nothing after it is looked at.
        """
        if not _well_formed(events):
            events = self._checked(events)
        if _ERROR_EVENTS[0] in events or _ERROR_EVENTS[1] in events:
            events = self._cut_at_error(events)
        if _FINISH.search(events):
            self.finish_reason = _FINISH.findall(events)[-1].decode()
        if _USAGE_MARK in events:
            events = self._take_usage(events, keep_usage)
        if _DONE in events:
            self.done = True
            return events.replace(_DONE, b"")
        return events

    def _checked(self, events: bytes) -> bytes:
        """The slow check: drop SSE comments, keep ``data:`` events holding a JSON object."""
        kept = []
        for event in events.split(b"\n\n")[:-1]:
            if event.startswith(b":"):
                continue  # a comment (keep-alive): the gateway sends its own
            data = event.removeprefix(b"data:").lstrip(b" ")
            if data == event or not _json_object(data):
                shown = event[:80].decode(errors="replace")
                self.failure = EngineError(
                    f"the engine sent a malformed stream event: {shown!r}", code="engine_bad_chunk"
                )
                break
            kept.append(b"data: " + data + b"\n\n")
        return b"".join(kept)

    def _cut_at_error(self, events: bytes) -> bytes:
        """The events before the engine's error event; the error becomes ``failure``."""
        kept = []
        for event in events.split(b"\n\n")[:-1]:
            if event.startswith(_ERROR_EVENTS):
                self.failure = _error_event(event)
                break
            kept.append(event + b"\n\n")
        return b"".join(kept)

    def _take_usage(self, events: bytes, keep_usage: bool) -> bytes:
        kept = []
        for event in events.split(b"\n\n"):
            if _USAGE_MARK in event and event.startswith(b"data: {"):
                chunk = orjson.loads(event[6:])
                if not chunk.get("choices") and isinstance(chunk.get("usage"), dict):
                    self.usage = chunk["usage"]
                    if not keep_usage:
                        continue
            kept.append(event)
        return b"\n\n".join(kept)

    def scan_body(self, body: bytes) -> None:
        parsed = orjson.loads(body)
        if isinstance(parsed.get("usage"), dict):
            self.usage = parsed["usage"]
        choices = parsed.get("choices") or [{}]
        self.finish_reason = choices[0].get("finish_reason")


def _well_formed(events: bytes) -> bool:
    """The fast check: every event is ``data: {...}`` or ``data: [DONE]``."""
    n = events.count(b"\n\n")  # events always end with one: the reader cuts there
    return (
        events.startswith(b"data: ")
        and events.count(b"\n\ndata: ") == n - 1
        and events.count(b"}\n\n") + events.count(_DONE) == n
    )


def _json_object(data: bytes) -> bool:
    if data == b"[DONE]":
        return True
    try:
        return isinstance(orjson.loads(data), dict)
    except orjson.JSONDecodeError:
        return False


def _error_event(event: bytes) -> EngineError:
    """An error the engine reported inside an open stream (vLLM does, e.g. on overload)."""
    parsed = orjson.loads(event[6:])
    error = parsed.get("error", parsed)
    message = error.get("message") if isinstance(error, dict) else None
    return EngineError(
        f"the engine failed mid-stream: {message or 'no reason given'}",
        code="engine_stream_error",
    )


def open_session(settings: Settings) -> aiohttp.ClientSession:
    """The worker's one HTTP client for every engine (create it inside the running loop).

    aiohttp rather than httpx: its C HTTP parser and O(1) connection pool cost a
    fraction of httpx's CPU per streamed chunk and per request (the streaming
    benchmark's profile: httpcore's pool scans every connection on each request).
    """
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_S)
    timeout = aiohttp.ClientTimeout(
        total=None,
        sock_connect=settings.engine_connect_timeout_s,
        sock_read=settings.engine_read_timeout_s,
    )
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=[_hand_over_trace()],
    )  # fmt: skip


def _hand_over_trace() -> aiohttp.TraceConfig:
    """Calls a request's ``trace_request_ctx``, when it is a callable, once its body is
    written: the engine has a non-streamed request then (its answer comes only at the end),
    and admission stops counting the job as on its way (``start.lua``)."""

    async def on_chunk_sent(_: aiohttp.ClientSession, context: SimpleNamespace, __: object) -> None:
        if callable(context.trace_request_ctx):
            context.trace_request_ctx()

    config = aiohttp.TraceConfig()
    config.on_request_chunk_sent.append(on_chunk_sent)
    return config


def stream_timeout(settings: Settings) -> aiohttp.ClientTimeout:
    """A streamed call's timeouts: ``sock_read`` bounds the silence between two pieces."""
    return aiohttp.ClientTimeout(
        total=None,
        sock_connect=settings.engine_connect_timeout_s,
        sock_read=settings.engine_stream_idle_timeout_s,
    )


async def stream_events(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    accounting: Accounting,
    *,
    keep_usage: bool,
    timeout: aiohttp.ClientTimeout,
    on_response: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """Yield complete SSE events as they arrive (several per item when they came together).

    ``timeout.sock_read`` bounds the silence between two pieces: the engine's hang.
    ``on_response`` is called once the engine answered with its headers (it has the
    request), before the first event.
    """
    try:
        async with session.post(url, data=payload, headers=_HEADERS, timeout=timeout) as response:
            if on_response is not None:
                on_response()
            if response.status != 200:
                raise EngineError.from_response(response.status, await response.read())
            tail = b""
            async for piece in response.content.iter_any():
                tail += piece.replace(b"\r\n", b"\n") if b"\r" in piece else piece
                cut = tail.rfind(b"\n\n")
                if cut < 0:
                    continue
                events, tail = accounting.scan(tail[: cut + 2], keep_usage), tail[cut + 2 :]
                if events:
                    yield events
                if accounting.failure is not None:
                    raise accounting.failure
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _transport_error(exc, url, timeout) from exc
    if not accounting.done:
        raise EngineError(
            f"the engine's stream from {url} ended before the response was complete",
            code="engine_stream_cut",
            retryable=True,
        )


async def complete(
    session: aiohttp.ClientSession,
    url: str,
    payload: bytes,
    accounting: Accounting,
    on_sent: Callable[[], None] | None = None,
) -> bytes:
    """Send a non-streamed request; returns the engine's JSON body. ``on_sent`` is called
    once the request's body is written."""
    try:
        post = session.post(url, data=payload, headers=_HEADERS, trace_request_ctx=on_sent)
        async with post as response:
            body = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _transport_error(exc, url, session.timeout) from exc
    if response.status != 200:
        raise EngineError.from_response(response.status, body)
    try:
        accounting.scan_body(body)
    except (orjson.JSONDecodeError, AttributeError) as exc:
        raise EngineError(
            f"the engine sent a body that is not a JSON object from {url}", code="engine_bad_body"
        ) from exc
    return body


def _transport_error(exc: Exception, url: str, timeout: aiohttp.ClientTimeout) -> EngineError:
    """No connection, silence, or a connection that broke: all worth another call."""
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError):
        message, code = f"the engine at {url} could not be reached: {exc!r}", "engine_unreachable"
    elif isinstance(exc, TimeoutError):  # aiohttp's SocketTimeoutError: sock_read ran out
        message = f"the engine at {url} sent nothing for {timeout.sock_read}s: {type(exc).__name__}"
        return EngineError(message, status=504, code="engine_timeout", retryable=True)
    else:  # the server disconnected, a payload cut short, a reset
        message, code = f"the engine connection broke at {url}: {exc!r}", "engine_stream_cut"
    return EngineError(message, code=code, retryable=True)


# Below the engine's own keep-alive (uvicorn's, and so vLLM's, is 5 s): a pooled
# connection is dropped here before the server may close it under a new request.
_KEEPALIVE_S = 4.0
_HEADERS = {"content-type": "application/json", "accept": "text/event-stream, application/json"}
