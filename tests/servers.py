"""Running an ASGI app under a real uvicorn on 127.0.0.1 in a thread, for tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

START_STOP_S = 10.0


@contextlib.contextmanager
def uvicorn_thread(app: Any, *, lifespan: str = "on") -> Iterator[str]:
    """``app`` served on a free loopback port; yields its base URL, stops it after."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_STOP_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(START_STOP_S)
        sock.close()
        assert not thread.is_alive(), "server did not shut down"
