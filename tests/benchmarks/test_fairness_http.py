"""The fairness benchmark's lean HTTP client against a raw server on 127.0.0.1, which
answers with the framings a server may use: chunks (uvicorn's streams), a length, the
connection's close, an error status, and a stream cut in the middle."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import orjson
import pytest

from benchmarks._fairness_http import ERROR_BODY_BYTES, Answer, HttpFailure, post

Reply = Callable[[asyncio.StreamWriter], Awaitable[None]]


async def _serve(reply: Reply, call: Callable[[str], Awaitable[Answer]]) -> tuple[Answer, bytes]:
    """Serve one request with ``reply``; ``call`` gets the URL. (What the call returned,
    the request as the server read it.)"""
    seen = bytearray()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )  # fmt: skip
        seen.extend(head + await reader.readexactly(length))
        await reply(writer)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with asyncio.timeout(10):
            answer = await call(f"http://127.0.0.1:{port}/v1/chat/completions")
    finally:
        server.close()
        await server.wait_closed()
    return answer, bytes(seen)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_chunked_stream_reaches_on_body_in_order_and_the_request_is_well_formed() -> None:
    events = [b'data: {"n": %d}\n\n' % i for i in range(50)]

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(_chunk(event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")

    got: list[bytes] = []
    answer, request = asyncio.run(
        _serve(reply, lambda url: post(url, b'{"a": 1}', {"Authorization": "Bearer k"}, got.append))
    )
    assert answer.status == 200 and answer.body == b""
    assert b"".join(got) == b"".join(events)
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"Authorization: Bearer k\r\n" in request and b"Connection: close\r\n" in request
    assert request.endswith(b'\r\n\r\n{"a": 1}')


def test_a_whole_answer_with_a_length_or_ended_by_the_close_is_kept_in_the_body() -> None:
    body = orjson.dumps({"usage": {"completion_tokens": 7}})

    async def with_length(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async def until_close(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)

    for reply in (with_length, until_close):
        answer, _ = asyncio.run(_serve(reply, lambda url: post(url, b"{}", {})))
        assert answer.status == 200 and answer.body == body


def test_an_error_status_keeps_the_start_of_its_body_and_passes_nothing_on() -> None:
    text = b'{"error": {"message": "' + b"x" * 500 + b'"}}'

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 429 Too Many\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))

    got: list[bytes] = []
    answer, _ = asyncio.run(_serve(reply, lambda url: post(url, b"{}", {}, got.append)))
    assert answer.status == 429
    assert answer.body == text[:ERROR_BODY_BYTES]
    assert got == []


def test_a_stream_cut_before_its_last_chunk_fails() -> None:
    async def cut(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(_chunk(b'data: {"n": 1}\n\n'))  # and no last chunk

    with pytest.raises(HttpFailure, match="closed before the answer ended"):
        asyncio.run(_serve(cut, lambda url: post(url, b"{}", {}, lambda _: None)))


def test_a_refused_connection_is_an_os_error() -> None:
    async def refused() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        await post(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}", {})

    with pytest.raises(OSError):
        asyncio.run(refused())
