"""fairq's uvicorn server (``broker.process.uvicorn_server``): an idle main loop that
still stops at once."""

from __future__ import annotations

import signal

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from broker.process import uvicorn_server
from tests.support import local_http
from tests.support.servers import START_STOP_S, free_socket, running


async def _hello(_: object) -> PlainTextResponse:
    return PlainTextResponse("hello")


def test_a_stop_signal_ends_the_server_without_waiting_for_its_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An hour between ticks: a server that waited for its next tick would not stop in time.
    monkeypatch.setattr(uvicorn_server, "TICK_S", 3600.0)
    sock = free_socket()
    port = sock.getsockname()[1]
    app = Starlette(routes=[Route("/", _hello)])
    server = uvicorn_server.QuietSignalServer(
        uvicorn_server.quiet_config(app, "127.0.0.1", port, 1.0)
    )
    with running(server, sock) as thread:
        reply = local_http.get(f"http://127.0.0.1:{port}/", timeout=START_STOP_S)
        assert reply.text == "hello" and "date" in reply.headers
        server.handle_exit(signal.SIGTERM, None)  # what the signal handler calls
        thread.join(START_STOP_S)
        assert not thread.is_alive(), "the server waited for its tick to see the signal"
