"""The gateway's last-resort handler (``gateway.errors.CatchAll``): an unexpected exception
is a 500 OpenAI error object with an error id that the log holds beside the traceback."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from gateway.errors import ERROR_ID_HEADER, CatchAll


async def _failing(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("redis://10.0.0.7:6379 said no")  # an internal detail


def test_an_unexpected_error_is_a_500_with_an_error_id_the_log_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=CatchAll(_failing))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.get("/v1/models")

    with caplog.at_level(logging.ERROR, logger="gateway.errors"):
        response = asyncio.run(get())
    assert response.status_code == 500
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "internal_error")
    assert "10.0.0.7" not in response.text
    found = re.search(r"error id ([0-9a-f]{12})", error["message"])
    assert found is not None, error["message"]
    assert response.headers[ERROR_ID_HEADER] == found.group(1)
    logged = [r for r in caplog.records if found.group(1) in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback, under that id
