"""``gateway.body_writer`` under a real uvicorn on 127.0.0.1 (the gateway's server).

The writer bypasses ASGI's ``send`` and so depends on uvicorn's internals: these
tests fail if a uvicorn release changes them, instead of the gateway silently
falling back to the slower path (or writing a broken chunked body).
"""

from __future__ import annotations

import threading
from typing import Any

import httpx

from gateway.body_writer import body_writer
from tests.support import local_http
from tests.support.servers import uvicorn_thread

_START = {"type": "http.response.start", "status": 200,
          "headers": [(b"content-type", b"text/plain")]}  # fmt: skip
_PIECE = b"x" * 16384
_MAX_PIECES = 4096  # 64 MiB: far beyond any socket buffer, so writing must pause first


def _body(data: bytes, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": data, "more_body": more}


def test_chunks_written_at_once_and_through_send_arrive_whole_and_in_order() -> None:
    seen: dict[str, bool] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        seen["before start"] = body_writer(send) is not None
        await send(_START)
        write = body_writer(send)
        seen["after start"] = write is not None
        assert write is not None
        seen["wrote"] = all([write(b"one,"), write(b"two,")])
        await send(_body(b"three,"))
        assert write(b"four")
        await send(_body(b"", more=False))

    with uvicorn_thread(app, lifespan="off") as url:
        reply = local_http.get(url, timeout=10)
    assert reply.status_code == 200
    assert reply.headers["transfer-encoding"] == "chunked"
    assert reply.content == b"one,two,three,four"
    assert seen == {"before start": False, "after start": True, "wrote": True}


def test_a_client_that_does_not_read_makes_the_writer_decline_and_send_wait() -> None:
    paused = threading.Event()
    written: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(_START)
        write = body_writer(send)
        assert write is not None
        count = 0
        while count < _MAX_PIECES and write(_PIECE):
            count += 1
        written.append(count)
        paused.set()
        await send(_body(b"end"))  # waits until the client has read enough
        await send(_body(b"", more=False))

    with uvicorn_thread(app, lifespan="off") as url, httpx.stream("GET", url, timeout=30) as reply:
        assert paused.wait(20), "the app never finished writing"
        body = reply.read()
    assert 0 < written[0] < _MAX_PIECES  # the writer declined once the buffers were full
    assert body == _PIECE * written[0] + b"end"


async def test_no_writer_behind_a_send_that_is_not_uvicorns() -> None:
    async def send(message: dict[str, Any]) -> None:
        pass

    assert body_writer(send) is None
