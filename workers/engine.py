"""Talking to an engine over HTTP: send one job's payload, hand back its output.

Streamed responses pass through as bytes, handed on from inside the HTTP
client's protocol callback (``workers.engine_http``), so a token wakes no task.
The cutter splits the byte stream at
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from broker import RequestKind, Settings
from workers.engine_http import (
    ConnectFailed,
    EngineClient,
    HttpClientError,
    SilenceTimeout,
)
from workers.errors import EngineError
from workers.resume import Earlier, counted_once

_DONE = b"data: [DONE]\n\n"
_FINISH = re.compile(rb'"finish_reason":"([A-Za-z_]+)"')
_FINISH_MARK = b'"finish_reason":"'
_USAGE_MARK = b'"usage":{'
_ERROR_EVENTS = (b'data: {"error"', b'data: {"object":"error"')


@dataclass
class Accounting:
    """What the worker records about a response besides passing it on."""

    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    earlier: Earlier | None = None  # a resumed answer: what its client has already
    done: bool = False  # the stream's [DONE] arrived: the response is whole
    failure: EngineError | None = None  # a bad or error event ended the stream (see scan)

    def scan(self, events: bytes, keep_usage: bool) -> bytes:
        """Note usage and finish reason; return the events to forward.

        A malformed or error event sets ``failure``: the events before it (they may
        have come in the same read) are returned to be forwarded, then the caller
        raises it; nothing after it is looked at.
        """
        if _one_token(events):  # the usual piece: skip the searches that cannot match
            if events.startswith(_ERROR_EVENTS):
                events = self._cut_at_error(events)
            elif _FINISH_MARK in events or _USAGE_MARK in events:
                events = self._note_end(events, keep_usage)  # the last token, or usage
            return events
        if not _well_formed(events):
            events = self._checked(events)
        if _ERROR_EVENTS[0] in events or _ERROR_EVENTS[1] in events:
            events = self._cut_at_error(events)
        events = self._note_end(events, keep_usage)
        if _DONE in events:
            self.done = True
            return events.replace(_DONE, b"")
        return events

    def _note_end(self, events: bytes, keep_usage: bool) -> bytes:
        """Note the finish reason and usage; the events without a usage chunk unless kept."""
        found = _FINISH.findall(events) if _FINISH_MARK in events else None  # search first
        if found:
            self.finish_reason = found[-1].decode()
        if _USAGE_MARK in events:
            events = self._take_usage(events, keep_usage)
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
                    counted = self._count_once(chunk, event)
                    if keep_usage:
                        kept.append(counted)
                    continue
            kept.append(event)
        return b"\n\n".join(kept)

    def _count_once(self, chunk: dict[str, Any], event: bytes) -> bytes:
        """The usage chunk as the client gets it: a resumed answer's usage counts the tokens
        of every attempt once (``workers.resume``); as the engine sent it otherwise."""
        if self.earlier is None:
            return event
        self.usage = chunk["usage"] = counted_once(chunk["usage"], self.earlier)
        return b"data: " + orjson.dumps(chunk)

    def scan_body(self, body: bytes) -> None:
        parsed = orjson.loads(body)
        if isinstance(parsed.get("usage"), dict):
            self.usage = fairq_usage(parsed["usage"])
        if parsed.get("object") == "response":  # the Responses API: no choices, a status
            self.finish_reason = _status(parsed)
            return
        choices = parsed.get("choices") or [{}]
        self.finish_reason = choices[0].get("finish_reason")


class ResponsesAccounting(Accounting):
    """A Responses API stream's accounting: named events (``event: <type>`` then one
    ``data:`` line), no ``[DONE]``. Its end is ``response.completed`` or
    ``response.incomplete``, whose response holds the usage: the only events parsed. An
    ``error`` or ``response.failed`` event is the engine failing mid-stream. Every event
    passes on as it came (there is no usage chunk to drop); a comment is dropped."""

    def scan(self, events: bytes, keep_usage: bool) -> bytes:
        kept = []
        for event in events.split(b"\n\n")[:-1]:
            if event.startswith(b":"):
                continue
            name, data = _named(event)
            if data is None:
                shown = event[:80].decode(errors="replace")
                self.failure = EngineError(
                    f"the engine sent a malformed stream event: {shown!r}", code="engine_bad_chunk"
                )
                break
            if name in _RESPONSE_FAILED:
                self.failure = _error_event(b"data: " + data)
                break
            if name in _RESPONSE_ENDS:
                self._note_response(data)
            kept.append(event + b"\n\n")
        return b"".join(kept)

    def _note_response(self, data: bytes) -> None:
        response = orjson.loads(data).get("response") or {}
        if isinstance(response.get("usage"), dict):
            self.usage = fairq_usage(response["usage"])
        self.finish_reason = _status(response)
        self.done = True


_RESPONSE_ENDS = (b"response.completed", b"response.incomplete")
_RESPONSE_FAILED = (b"error", b"response.failed")


def _named(event: bytes) -> tuple[bytes | None, bytes | None]:
    """An event's name (None without an ``event:`` line) and its data, a JSON object (None:
    a malformed event). Only the shape is checked: a newline cannot occur inside JSON."""
    name = None
    if event.startswith(b"event:"):
        line, _, event = event.partition(b"\n")
        name = line[6:].strip()
    data = event.removeprefix(b"data:").lstrip(b" ")
    if data == event or not (data.startswith(b"{") and data.endswith(b"}")) or b"\n" in data:
        return name, None
    return name, data


def _status(response: dict[str, Any]) -> str | None:
    """A response's end as fairq records a finish reason: ``completed``, or why it is
    incomplete (``max_output_tokens``: the length limit)."""
    details = response.get("incomplete_details")
    if isinstance(details, dict) and isinstance(details.get("reason"), str):
        return str(details["reason"])
    status = response.get("status")
    return status if isinstance(status, str) else None


def fairq_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Usage in the names fairq's accounting reads (``complete.lua``: fairness and quotas):
    the Responses API's ``input_tokens`` and ``output_tokens`` become ``prompt_tokens`` and
    ``completion_tokens``; an embedding's, without output, has ``prompt_tokens`` alone."""
    if "input_tokens" not in usage or "prompt_tokens" in usage:
        return usage
    prompt, output = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


def accounting_for(kind: RequestKind, earlier: Earlier | None = None) -> Accounting:
    """The accounting of one engine call of a job of ``kind``."""
    if kind is RequestKind.RESPONSE:
        return ResponsesAccounting(earlier=earlier)
    return Accounting(earlier=earlier)


def _one_token(events: bytes) -> bool:
    """One well-formed event holding a JSON object, as nearly every piece of a stream is
    (raw newlines cannot occur inside JSON: the only blank line is the one at its end)."""
    return (
        events.startswith(b"data: {")
        and events.endswith(b"}\n\n")
        and events.find(b"\n\n") == len(events) - 2
    )


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


def engine_headers(settings: Settings) -> dict[str, str]:
    """What every call of an engine's API carries: its key, when the engines have one."""
    if settings.engine_api_key is None:
        return {}
    return {"Authorization": f"Bearer {settings.engine_api_key.get_secret_value()}"}


def open_client(settings: Settings) -> EngineClient:
    """The worker's one HTTP client for every engine (create it inside the running loop)."""
    return EngineClient(settings.engine_connect_timeout_s, headers=engine_headers(settings))


class _EventCutter:
    """Cuts a streamed body at event boundaries and hands complete events on.

    Called with each piece of body as it arrives (inside the client's protocol
    callback); raises the stream's failure once its good events are handed on.
    """

    __slots__ = ("_accounting", "_keep_usage", "_on_events", "_tail")

    def __init__(
        self, accounting: Accounting, keep_usage: bool, on_events: Callable[[bytes], None]
    ) -> None:
        self._accounting = accounting
        self._keep_usage = keep_usage
        self._on_events = on_events
        self._tail = b""

    def feed(self, piece: bytes) -> None:
        tail = self._tail + (piece.replace(b"\r\n", b"\n") if b"\r" in piece else piece)
        cut = tail.rfind(b"\n\n")
        if cut < 0:
            self._tail = tail
            return
        self._tail = tail[cut + 2 :]
        events = self._accounting.scan(tail[: cut + 2], self._keep_usage)
        if events:
            self._on_events(events)
        if self._accounting.failure is not None:
            raise self._accounting.failure


async def stream_events(
    client: EngineClient,
    url: str,
    payload: bytes,
    accounting: Accounting,
    on_events: Callable[[bytes], None],
    *,
    keep_usage: bool,
    idle_timeout_s: float,
    on_response: Callable[[bool], None] | None = None,
) -> None:
    """Stream a response, handing complete SSE events to ``on_events`` as they arrive
    (several at once when they came together), from inside the client's protocol.

    ``idle_timeout_s`` bounds the silence between two pieces: the engine's hang.
    ``on_response`` is called once the engine answered with its headers (it has the
    request), before the first event: with True when it accepted the request (200).
    """
    cutter = _EventCutter(accounting, keep_usage, on_events)
    on_headers = None if on_response is None else lambda status: on_response(status == 200)
    await _post_ok(client, url, payload, idle_timeout_s, cutter.feed, on_headers=on_headers)
    if not accounting.done:
        raise EngineError(
            f"the engine's stream from {url} ended before the response was complete",
            code="engine_stream_cut",
            retryable=True,
        )


async def complete(
    client: EngineClient,
    url: str,
    payload: bytes,
    accounting: Accounting,
    *,
    idle_timeout_s: float,
    on_sent: Callable[[], None] | None = None,
) -> bytes:
    """Send a non-streamed request; returns the engine's JSON body. ``on_sent`` is called
    once the request is written: the engine has it then, and its answer comes only at
    the end (admission stops counting the job as on its way, ``start.lua``)."""
    pieces: list[bytes] = []
    await _post_ok(client, url, payload, idle_timeout_s, pieces.append, on_written=on_sent)
    body = b"".join(pieces)
    try:
        accounting.scan_body(body)
    except (orjson.JSONDecodeError, AttributeError) as exc:
        raise EngineError(
            f"the engine sent a body that is not a JSON object from {url}", code="engine_bad_body"
        ) from exc
    return body


async def _post_ok(
    client: EngineClient,
    url: str,
    payload: bytes,
    idle_timeout_s: float,
    on_body: Callable[[bytes], None],
    *,
    on_headers: Callable[[int], None] | None = None,
    on_written: Callable[[], None] | None = None,
) -> None:
    """POST to the engine; every failure, an error status included, as an ``EngineError``."""
    answered = False  # the response's headers came: the engine took the request

    def headers(status: int) -> None:
        nonlocal answered
        answered = True
        if on_headers is not None:
            on_headers(status)

    try:
        reply = await client.post(
            url,
            payload,
            idle_timeout_s=idle_timeout_s,
            on_body=on_body,
            on_headers=headers,
            on_written=on_written,
        )
    except HttpClientError as exc:
        raise _transport_error(exc, url, answered=answered) from exc
    if reply.status != 200:
        raise EngineError.from_response(reply.status, reply.body)


def _transport_error(exc: HttpClientError, url: str, *, answered: bool) -> EngineError:
    """No connection, silence, or a connection that broke: all worth another call. The
    engine never took the request when there was no connection, or it broke before the
    engine answered (a replica going away); a silence may be a request it is working on."""
    if isinstance(exc, ConnectFailed):
        message, code = f"the engine at {url} could not be reached: {exc}", "engine_unreachable"
    elif isinstance(exc, SilenceTimeout):
        return EngineError(f"{exc} (from {url})", status=504, code="engine_timeout", retryable=True)
    else:  # the server disconnected, a response cut short or not HTTP, a reset
        message, code = f"the engine connection broke at {url}: {exc}", "engine_stream_cut"
    return EngineError(message, code=code, retryable=True, unaccepted=not answered)
