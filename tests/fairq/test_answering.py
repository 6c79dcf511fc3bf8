"""``wait_answering``: True once a URL answers 200; False past the timeout or once the
process that would answer is gone, without waiting out the timeout."""

from __future__ import annotations

import time
from typing import Any

from fairq.stack.answering import wait_answering
from fairq.stack.localredis import free_port
from tests.support.servers import uvicorn_thread


async def _status(scope: Any, receive: Any, send: Any) -> None:
    status = 200 if scope["path"] == "/ok" else 503
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_true_once_the_url_answers_200() -> None:
    with uvicorn_thread(_status, lifespan="off") as url:
        assert wait_answering(f"{url}/ok", 10)


def test_false_past_the_timeout_while_the_url_answers_otherwise() -> None:
    with uvicorn_thread(_status, lifespan="off") as url:
        start = time.monotonic()
        assert not wait_answering(f"{url}/starting", 0.5)
    assert 0.5 <= time.monotonic() - start < 5


def test_false_at_once_when_the_process_is_gone() -> None:
    start = time.monotonic()
    assert not wait_answering(f"http://127.0.0.1:{free_port()}/", 30, alive=lambda: False)
    assert time.monotonic() - start < 5
