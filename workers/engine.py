"""Talking to an engine over HTTP: send one job's payload, hand back its output.

Streamed responses pass through as bytes: the reader cuts the byte stream at
event boundaries and only looks inside the few events that accounting needs
(the usage chunk and the one with a finish reason), found with a byte search,
so a token costs no JSON parsing here. ``data: [DONE]`` is dropped: the
gateway ends every stream itself, after the job's end is recorded.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import orjson

from workers.errors import EngineError

_DONE = b"data: [DONE]\n\n"
_FINISH = re.compile(rb'"finish_reason":"([A-Za-z_]+)"')
_USAGE_MARK = b'"usage":{'


@dataclass
class Accounting:
    """What the worker records about a response besides passing it on."""

    usage: dict[str, int] | None = None
    finish_reason: str | None = None

    def scan(self, events: bytes, keep_usage: bool) -> bytes:
        """Note usage and finish reason; return the events to forward."""
        if _FINISH.search(events):
            self.finish_reason = _FINISH.findall(events)[-1].decode()
        if _USAGE_MARK in events:
            events = self._take_usage(events, keep_usage)
        return events.replace(_DONE, b"") if _DONE in events else events

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


async def stream_events(
    client: httpx.AsyncClient, url: str, payload: bytes, accounting: Accounting, keep_usage: bool
) -> AsyncIterator[bytes]:
    """Yield complete SSE events as they arrive (several per item when they came together)."""
    try:
        async with client.stream("POST", url, content=payload, headers=_HEADERS) as response:
            if response.status_code != 200:
                raise EngineError.from_response(response.status_code, await response.aread())
            tail = b""
            async for piece in response.aiter_raw():
                tail += piece.replace(b"\r\n", b"\n") if b"\r" in piece else piece
                cut = tail.rfind(b"\n\n")
                if cut < 0:
                    continue
                events, tail = accounting.scan(tail[: cut + 2], keep_usage), tail[cut + 2 :]
                if events:
                    yield events
    except httpx.TimeoutException as exc:
        raise EngineError(
            f"the engine did not answer in time at {url}: {type(exc).__name__}",
            status=504,
            code="engine_timeout",
        ) from exc
    except httpx.HTTPError as exc:
        raise EngineError(
            f"the engine connection failed at {url}: {exc!r}", code="engine_unreachable"
        ) from exc


async def complete(
    client: httpx.AsyncClient, url: str, payload: bytes, accounting: Accounting
) -> bytes:
    """Send a non-streamed request; returns the engine's JSON body."""
    try:
        response = await client.post(url, content=payload, headers=_HEADERS)
    except httpx.TimeoutException as exc:
        raise EngineError(
            f"the engine did not answer in time at {url}", status=504, code="engine_timeout"
        ) from exc
    except httpx.HTTPError as exc:
        raise EngineError(
            f"the engine connection failed at {url}: {exc!r}", code="engine_unreachable"
        ) from exc
    if response.status_code != 200:
        raise EngineError.from_response(response.status_code, response.content)
    try:
        accounting.scan_body(response.content)
    except (orjson.JSONDecodeError, AttributeError) as exc:
        raise EngineError(f"the engine sent a body that is not a JSON object from {url}") from exc
    return response.content


_HEADERS = {"content-type": "application/json", "accept": "text/event-stream, application/json"}
