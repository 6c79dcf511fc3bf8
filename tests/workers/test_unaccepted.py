"""Which engine failures mean the engine never took the request (``EngineError.unaccepted``:
the job may go to another endpoint), against a scripted HTTP server on 127.0.0.1: no
connection, a connection lost before the response began, a 503; not a response that began
(a 200's headers came, whatever follows), another error status, or a silence (the engine
may be working on the request)."""

from __future__ import annotations

import pytest

from tests.workers.test_engine_http import CHUNKED_HEAD, CLOSE, chunk, fixed, scripted_server
from workers.engine import Accounting, complete, stream_events
from workers.engine_http import EngineClient
from workers.errors import EngineError

BODY = b'{"error":{"message":"no","type":"x","code":1}}'


async def failure(script: list[object], *, stream: bool = True, idle_s: float = 5.0) -> EngineError:
    """The ``EngineError`` one call to a server playing ``script`` ends with."""
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        with pytest.raises(EngineError) as info:
            if stream:
                await stream_events(
                    client, server.url, b"{}", Accounting(), lambda _: None,
                    keep_usage=False, idle_timeout_s=idle_s,
                )  # fmt: skip
            else:
                await complete(client, server.url, b"{}", Accounting(), idle_timeout_s=idle_s)
    return info.value


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_a_connection_lost_before_the_response_began_was_never_taken(stream: bool) -> None:
    error = await failure([CLOSE], stream=stream)
    assert error.unaccepted and error.retryable and error.code == "engine_stream_cut"


async def test_a_refused_connection_was_never_taken() -> None:
    async with scripted_server([CLOSE]) as server:
        url = server.url  # the server is gone after this block: its port refuses
    async with EngineClient(5.0) as client:
        with pytest.raises(EngineError) as info:
            await complete(client, url, b"{}", Accounting(), idle_timeout_s=5.0)
    assert info.value.unaccepted and info.value.code == "engine_unreachable"


@pytest.mark.parametrize(
    ("status", "unaccepted"),
    [("503 Service Unavailable", True), ("500 Internal Server Error", False),
     ("429 Too Many Requests", False), ("400 Bad Request", False)],
)  # fmt: skip
async def test_of_the_error_statuses_only_503_says_the_request_was_never_taken(
    status: str, unaccepted: bool
) -> None:
    error = await failure([fixed(status, BODY)])
    assert error.unaccepted is unaccepted and error.engine_status == int(status[:3])


@pytest.mark.parametrize(
    "script",
    [[CHUNKED_HEAD, CLOSE], [CHUNKED_HEAD, chunk(b'data: {"a":1}\n\n'), CLOSE]],
    ids=["before-the-first-event", "after-an-event"],
)
async def test_a_stream_cut_after_the_engine_answered_was_taken(script: list[object]) -> None:
    error = await failure(script)
    assert not error.unaccepted and error.retryable and error.code == "engine_stream_cut"


async def test_a_silence_before_any_answer_may_be_a_request_the_engine_works_on() -> None:
    error = await failure([1.0], idle_s=0.2)
    assert not error.unaccepted and error.code == "engine_timeout"
