"""The fairness benchmark's HTTP client: one POST per connection, read with little CPU.

The load client stands in for the clients of a deployment, which run on other machines;
here it shares two cores with the engine and fairq, and what it spends is taken from
them. httpx reads a streamed answer through several Python layers per event: in a long
flood (600,000 events) the load client took 50-80 s of CPU, as much as fairq's
processes together. This client is an asyncio protocol whose bytes httptools (the C
parser uvicorn uses) parses inside ``data_received``: a piece of body costs one
callback. Each request has a connection of its own (``Connection: close``), so there is
no pool to keep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

CONNECT_TIMEOUT_S = 30.0
ERROR_BODY_BYTES = 200  # of an answer other than 200, what the result keeps


class HttpFailure(Exception):
    """The request got no complete HTTP answer: the connection failed or broke, or the
    answer was not HTTP."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # empty when the body went to ``on_body``; else its first bytes if not 200


def _request(url: str, body: bytes, headers: Mapping[str, str]) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    lines = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return parts.hostname or "127.0.0.1", parts.port or 80, head + body


class _Reader(asyncio.Protocol):
    """Writes the request, parses the answer; ``done`` resolves when it has ended."""

    def __init__(self, request: bytes, on_body: Callable[[bytes], None] | None) -> None:
        self._request = request
        self._on_body = on_body
        self._parser = httptools.HttpResponseParser(self)
        self._kept = bytearray()
        self._headers_done = False
        self._framed = False  # a length or chunks say where the body ends, not the close
        self._transport: asyncio.Transport | None = None
        self.status = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(HttpFailure(f"the answer is not HTTP: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        # An answer without a length or chunks ends when its connection does.
        if self._headers_done and not self._framed:
            self._end(None)
        else:
            self._end(HttpFailure(f"the connection closed before the answer ended ({exc})"))

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            if len(self._kept) < ERROR_BODY_BYTES:
                self._kept += body
        elif self._on_body is not None:
            self._on_body(body)
        else:
            self._kept += body

    def on_message_complete(self) -> None:
        self._end(None)

    def _end(self, problem: Exception | None) -> None:
        if not self.done.done():
            if problem is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(problem)
        if self._transport is not None:
            self._transport.close()

    def answer(self) -> Answer:
        body = bytes(self._kept)
        return Answer(self.status, body if self.status == 200 else body[:ERROR_BODY_BYTES])


async def post(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    on_body: Callable[[bytes], None] | None = None,
) -> Answer:
    """POST ``body`` as JSON and read the whole answer. A 200 answer's body goes to
    ``on_body`` as it arrives (streams), or, without it, into ``Answer.body``. Raises
    ``HttpFailure`` or ``OSError`` when no complete answer came; cancelling closes the
    connection."""
    host, port, request = _request(url, body, headers)
    loop = asyncio.get_running_loop()
    connecting = loop.create_connection(lambda: _Reader(request, on_body), host, port)
    transport, reader = await asyncio.wait_for(connecting, CONNECT_TIMEOUT_S)
    try:
        await reader.done
    finally:
        transport.close()
    return reader.answer()
