"""``fairq up --engine-url URL``: the engine's kind read from its ``/metrics`` on a real
HTTP server on 127.0.0.1 serving each engine's page (``tests/fixtures``)."""

from __future__ import annotations

from typing import Any

import pytest

from fairq.stack.upconfig import detect_engine
from tests.support.paths import FIXTURES
from tests.support.servers import uvicorn_thread


def metrics_app(page: bytes) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        found = scope["path"] == "/metrics"
        body = page if found else b"not found"
        headers = [(b"content-type", b"text/plain; version=0.0.4")]
        await send(
            {"type": "http.response.start", "status": 200 if found else 404, "headers": headers}
        )
        await send({"type": "http.response.body", "body": body})

    return app


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("vllm-0.32-cpu/metrics_idle.txt", "vllm"),
        ("sglang-00ae9c15/metrics_busy.txt", "sglang"),
        ("tgi-db931fcf/metrics_busy.txt", "tgi"),
        ("llamacpp-fb402660/metrics_idle.txt", "llamacpp"),
        ("vllm-docs/metrics_excerpts.txt", "openai"),  # no queue gauge: nothing fairq reads
    ],
)
def test_the_engines_kind_is_read_from_its_queue_gauge(fixture: str, kind: str) -> None:
    with uvicorn_thread(metrics_app((FIXTURES / fixture).read_bytes()), lifespan="off") as url:
        assert detect_engine(url)[0] == kind
