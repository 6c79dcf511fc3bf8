"""The tests' loopback HTTP helper calls only plain-HTTP servers on this machine."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import local_http
from tests.support.servers import uvicorn_thread


@pytest.mark.parametrize(
    "url", ["https://127.0.0.1:1/", "http://example.com:80/", "http://10.0.0.1:80/"]
)
def test_a_url_that_is_not_plain_http_on_loopback_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not plain HTTP on the loopback interface"):
        local_http.get(url)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_loopback_server_answers() -> None:
    with uvicorn_thread(_app, lifespan="off") as url:
        assert url.startswith("http://127.0.0.1:")
        assert local_http.get(url, timeout=10).content == b"ok"
