"""A lean streaming client for the streaming benchmarks: many SSE streams, little CPU.

Each request is one HTTP/1.1 connection (``Connection: close``) read raw until
the server closes it; tokens are counted by a byte search for the start of a
content delta, so the client spends almost nothing per token and leaves the
cores to the processes being measured. Inter-token gaps are taken per read: a
read holding n tokens gives one gap (since the previous read with tokens) and
n - 1 gaps of zero, which is what a client reading events one by one would see.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

TOKEN = b'"delta":{"content":" '  # a token's chunk (the simulator's words start with a space)
_DONE = b"data: [DONE]"


@dataclass
class Load:
    """What all the streams of one arm received."""

    tokens: int = 0
    window_start: float = 0.0  # perf_counter time: gaps, TTFTs, window_tokens count from here
    window_tokens: int = 0
    requests: int = 0
    failed: int = 0
    gaps_ms: array[float] = field(default_factory=lambda: array("d"))
    ttft_ms: array[float] = field(default_factory=lambda: array("d"))


def _request(url: str, body: bytes, api_key: str | None) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    head = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n"
    )
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    return parts.hostname or "127.0.0.1", parts.port or 80, head.encode() + b"\r\n" + body


async def stream_once(url: str, body: bytes, api_key: str | None, load: Load) -> None:
    """One streamed request; its tokens, gaps and outcome go into ``load``."""
    host, port, request = _request(url, body, api_key)
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        last: float | None = None
        carry, status_ok, whole = b"", None, False
        while data := await reader.read(65536):
            if status_ok is None:
                status_ok = data.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))
            window = carry + data
            n = window.count(TOKEN)
            if n:
                now = time.perf_counter()
                load.tokens += n
                if last is None:
                    if start >= load.window_start:  # requests sent inside the window only
                        load.ttft_ms.append((now - start) * 1000)
                elif now >= load.window_start:
                    load.gaps_ms.append((now - last) * 1000)
                    load.gaps_ms.extend([0.0] * (n - 1))
                if now >= load.window_start:
                    load.window_tokens += n
                last = now
            whole = whole or _DONE in window
            carry = window[-(len(TOKEN) - 1) :]  # a marker cut in two by the reads
    finally:
        writer.close()
    load.requests += 1
    if not (status_ok and whole):
        load.failed += 1


async def run_load(
    url: str,
    body: dict[str, object],
    api_key: str | None,
    streams: int,
    *,
    seconds: float,
    load: Load | None = None,
    stagger_s: float = 0.0,
) -> Load:
    """``streams`` clients, each sending one streamed request after another for ``seconds``.

    ``stagger_s`` spreads the clients' first requests evenly over that time. Without it,
    they all start at once, and as each sends its next request when the last ends, their
    requests keep arriving in waves.
    """
    load = load or Load()
    payload = orjson.dumps(body)
    deadline = time.perf_counter() + seconds

    async def client(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        while time.perf_counter() < deadline:
            await stream_once(url, payload, api_key, load)

    await asyncio.gather(*(client(i * stagger_s / streams) for i in range(streams)))
    return load
