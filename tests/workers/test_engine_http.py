"""The worker's engine HTTP client against a scripted HTTP server on 127.0.0.1.

Every test runs on asyncio's own loop and on uvloop's (the worker's), whose
transports differ. The server reads each request whole, then plays a script of byte pieces (with
pauses) and may close the connection; it records the connections, the requests
and when each connection was closed by the client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop

from tests.support.eventually import aeventually
from workers.engine_http import (
    BadResponse,
    ConnectFailed,
    ConnectionBroke,
    EngineClient,
    SilenceTimeout,
    target_of,
)

CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
END = b"0\r\n\r\n"
DEADLINE_S = 5.0


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def fixed(status: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
        status.encode(), len(body), extra, body,
    )  # fmt: skip


LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


def on_both_loops(case: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    """A test that runs ``case`` once on each event loop."""

    @pytest.mark.parametrize("loop", LOOPS)
    def test(loop: str) -> None:
        LOOPS[loop](case())

    test.__name__ = test.__qualname__ = case.__name__
    test.__doc__ = case.__doc__
    return test


# A step of a script: bytes to send, a pause in seconds, or CLOSE.
CLOSE = object()


@dataclass
class Scripted:
    url: str
    scripts: list[list[object]]  # one per request, in order; the last repeats
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)


async def _read_request(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


async def _closed_within(reader: asyncio.StreamReader, pause_s: float) -> bool:
    """A pause of the script that ends early when the client closes the connection (True):
    a test waiting for the close then need not wait out the whole pause."""
    deadline = asyncio.get_running_loop().time() + pause_s
    while asyncio.get_running_loop().time() < deadline:
        if reader.at_eof() or reader.exception() is not None:
            return True
        await asyncio.sleep(0.01)
    return False


@contextlib.asynccontextmanager
async def scripted_server(*scripts: list[object]) -> AsyncIterator[Scripted]:
    state = Scripted("", list(scripts))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            while (request := await _read_request(reader)) is not None:
                index = min(len(state.requests), len(state.scripts) - 1)
                state.requests.append(request)
                for step in state.scripts[index]:
                    if step is CLOSE:
                        writer.close()
                        return
                    if isinstance(step, float):
                        if await _closed_within(reader, step):
                            state.client_closed.set()
                            return
                    else:
                        assert isinstance(step, bytes)
                        writer.write(step)
                        await writer.drain()
            state.client_closed.set()
        except ConnectionError:
            state.client_closed.set()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
    try:
        yield state
    finally:
        server.close()


async def post(client: EngineClient, url: str, idle_s: float = DEADLINE_S) -> tuple[int, bytes]:
    pieces: list[bytes] = []
    async with asyncio.timeout(DEADLINE_S):
        reply = await client.post(url, b'{"a":1}', idle_timeout_s=idle_s, on_body=pieces.append)
    return reply.status, b"".join(pieces) or reply.body


@on_both_loops
async def test_a_chunked_stream_arrives_whole_and_the_connection_is_kept_for_the_next_call() -> (
    None
):
    script = [CHUNKED_HEAD, chunk(b"data: 1\n\n"), 0.02, chunk(b"data: 2\n\n"), END]
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        assert await post(client, server.url) == (200, b"data: 1\n\ndata: 2\n\n")
        assert await post(client, server.url) == (200, b"data: 1\n\ndata: 2\n\n")
    assert server.connections == 1 and len(server.requests) == 2
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Host: {server.url.split('/')[2]}".encode() in head
    assert b"Content-Length: 7" in head and body == b'{"a":1}'


@on_both_loops
async def test_headers_given_go_out_with_the_clients_own() -> None:
    script = [CHUNKED_HEAD, chunk(b"data: 1\n\n"), END]
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        reply = await client.post(server.url, b'{"a":1}', idle_timeout_s=DEADLINE_S,
                                  on_body=lambda _: None,
                                  headers={"Authorization": "Bearer k"})  # fmt: skip
    assert reply.status == 200
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert b"\r\nAuthorization: Bearer k" in head and b"Content-Length: 7" in head
    assert body == b'{"a":1}'


@on_both_loops
async def test_the_engine_api_key_of_the_settings_goes_out_on_every_call() -> None:
    from broker import Settings
    from workers.engine import open_client

    settings = Settings(engine_api_key="engine-secret")
    script = [fixed("200 OK", b"{}")]
    async with scripted_server(script) as server, open_client(settings) as client:
        assert await post(client, server.url) == (200, b"{}")
        assert await post(client, server.url) == (200, b"{}")
    for request in server.requests:
        lines = request.partition(b"\r\n\r\n")[0].split(b"\r\n")
        assert lines.count(b"Authorization: Bearer engine-secret") == 1
    assert "engine-secret" not in repr(settings)


def test_a_header_with_a_line_break_is_refused_rather_than_split_into_two() -> None:
    with pytest.raises(ValueError, match="line break"):
        EngineClient(5.0, headers={"Authorization": "Bearer k\r\nX-Evil: 1"})


@on_both_loops
async def test_an_error_status_returns_its_body_and_never_calls_on_body() -> None:
    error = b'{"error":{"message":"overloaded"}}'
    server_script = [fixed("503 Service Unavailable", error)]
    async with scripted_server(server_script) as server, EngineClient(5.0) as client:
        streamed: list[bytes] = []
        reply = await client.post(
            server.url, b"{}", idle_timeout_s=DEADLINE_S, on_body=streamed.append
        )
    assert (reply.status, reply.body, streamed) == (503, error, [])


@on_both_loops
async def test_a_response_that_says_connection_close_is_not_reused() -> None:
    script = [fixed("200 OK", b"{}", b"connection: close\r\n")]
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        assert await post(client, server.url) == (200, b"{}")
        assert await post(client, server.url) == (200, b"{}")
    assert server.connections == 2


@on_both_loops
async def test_a_pooled_connection_the_server_closed_is_replaced_without_an_error() -> None:
    script = [fixed("200 OK", b"{}"), CLOSE]  # keep-alive promised, then closed anyway
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        assert await post(client, server.url) == (200, b"{}")
        await aeventually(
            lambda: not client.pooled, "the close to reach the client", DEADLINE_S, interval_s=0.01
        )
        assert await post(client, server.url) == (200, b"{}")
    assert server.connections == 2


@on_both_loops
async def test_a_connection_idle_past_the_keepalive_is_not_reused() -> None:
    server_script = [fixed("200 OK", b"{}")]
    async with scripted_server(server_script) as server, EngineClient(5.0, 0.05) as client:
        await post(client, server.url)
        await asyncio.sleep(0.1)
        await post(client, server.url)
    assert server.connections == 2


@on_both_loops
async def test_silence_past_the_idle_timeout_is_a_silence_timeout() -> None:
    script = [CHUNKED_HEAD, chunk(b"data: 1\n\n"), 3.0, END]
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        with pytest.raises(SilenceTimeout, match=r"sent nothing for 0\.3s"):
            await post(client, server.url, idle_s=0.3)
        async with asyncio.timeout(DEADLINE_S):
            await server.client_closed.wait()  # the hung request's connection was closed


@on_both_loops
async def test_a_steady_trickle_longer_than_the_idle_timeout_is_not_a_hang() -> None:
    pieces = [step for n in range(8) for step in (chunk(b"data: %d\n\n" % n), 0.1)]
    script = [CHUNKED_HEAD, *pieces, END]  # 0.8 s in all, never silent for 0.5 s
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        status, body = await post(client, server.url, idle_s=0.5)
    assert status == 200 and body.count(b"\n\n") == 8


@on_both_loops
async def test_a_response_cut_mid_way_is_a_broken_connection() -> None:
    script = [CHUNKED_HEAD, chunk(b"data: 1\n\n"), CLOSE]
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        with pytest.raises(ConnectionBroke):
            await post(client, server.url)


@on_both_loops
async def test_bytes_that_are_not_http_are_a_bad_response() -> None:
    script = [b"SSH-2.0-OpenSSH_9.6\r\n\r\n"]
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        with pytest.raises(BadResponse, match="not valid HTTP"):
            await post(client, server.url)


@on_both_loops
async def test_a_refused_connection_is_connect_failed() -> None:
    async with scripted_server([END]) as server:
        url = server.url  # the server is gone after this block: its port refuses
    async with EngineClient(5.0) as client:
        with pytest.raises(ConnectFailed, match="ConnectionRefusedError"):
            await post(client, url)


@on_both_loops
async def test_an_error_raised_by_on_body_ends_the_call_and_closes_the_connection() -> None:
    script = [CHUNKED_HEAD, chunk(b"data: 1\n\n"), 3.0, END]

    def refuse(_: bytes) -> None:
        raise ValueError("the caller refused this piece")

    async with scripted_server(script) as server, EngineClient(5.0) as client:
        with pytest.raises(ValueError, match="refused this piece"):
            await client.post(server.url, b"{}", idle_timeout_s=DEADLINE_S, on_body=refuse)
        async with asyncio.timeout(DEADLINE_S):
            await server.client_closed.wait()


@on_both_loops
async def test_a_cancelled_call_closes_its_connection_so_the_engine_stops() -> None:
    script = [CHUNKED_HEAD, chunk(b"data: 1\n\n"), 3.0, END]
    async with scripted_server(script) as server, EngineClient(5.0) as client:
        got: list[bytes] = []
        call = asyncio.create_task(
            client.post(server.url, b"{}", idle_timeout_s=DEADLINE_S, on_body=got.append)
        )
        await aeventually(lambda: got, "the first piece", DEADLINE_S, interval_s=0.01)
        call.cancel()
        async with asyncio.timeout(DEADLINE_S):
            await server.client_closed.wait()
    assert call.cancelled() and got == [b"data: 1\n\n"]


def test_targets_keep_the_port_query_and_an_ipv6_host_header() -> None:
    target = target_of("http://[::1]:8000/v1/completions?x=1")
    assert (target.host, target.port, target.tls) == ("::1", 8000, False)
    assert (target.host_header, target.path) == (b"[::1]:8000", b"/v1/completions?x=1")
    assert target_of("https://user:pw@engine.svc/v1/x").origin == ("engine.svc", 443, True)
    assert target_of("https://user:pw@engine.svc/v1/x").host_header == b"engine.svc"
    with pytest.raises(ConnectFailed, match="not an http"):
        target_of("ftp://engine/v1/x")
