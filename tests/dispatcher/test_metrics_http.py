"""The dispatcher's /metrics client (``dispatcher.metrics_http``) against scripted TCP
servers on 127.0.0.1: each framing of a body, kept-alive connections, the server that
closes an idle one, and every way a scrape can fail."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from dispatcher import metrics_http
from dispatcher.metrics_http import FetchError, MetricsClient, Page
from tests.support.eventually import aeventually
from tests.support.servers import stop

BODY = b"vllm:num_requests_waiting 2\n" * 300  # ~8 KB: several reads, several chunks
TEXT = b"text/plain; version=0.0.4; charset=utf-8"


def with_length(body: bytes = BODY, *, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n"
    return head % (TEXT, len(body), extra) + body


def chunked(body: bytes = BODY, pieces: int = 3) -> bytes:
    size = len(body) // pieces + 1
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n"
    return head % TEXT + framed + b"0\r\n\r\n"


CLOSE = b"<close>"  # close the connection instead of answering
HANG = b"<hang>"  # never answer


@dataclass
class Script:
    """Answers each request with the next of ``answers`` (whole responses, CLOSE, HANG; the
    last one repeats); keeps every request's bytes and counts connections."""

    answers: list[bytes]
    requests: list[bytes] = field(default_factory=list)
    connections: int = 0
    close_after: bool = False  # close the connection after each answer
    handlers: list[asyncio.Task[Any]] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        self.connections += 1
        self.handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    self.requests.append(await reader.readuntil(b"\r\n\r\n"))
                    answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
                    if answer == CLOSE:
                        break
                    if answer == HANG:
                        await asyncio.sleep(3600)
                    for i in range(0, len(answer), 1000):  # in pieces, as a socket may deliver
                        writer.write(answer[i : i + 1000])
                        await writer.drain()
                    if self.close_after:
                        break
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serving(script: Script) -> AsyncIterator[str]:
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        server.close()
        await stop(script.writers, script.handlers)


@pytest.fixture
async def client() -> AsyncIterator[MetricsClient]:
    made = MetricsClient()
    yield made
    made.close()


@pytest.mark.parametrize("answer", [with_length(), chunked()], ids=["length", "chunked"])
async def test_a_body_comes_whole_whatever_its_framing(
    client: MetricsClient, answer: bytes
) -> None:
    async with serving(Script([answer])) as url:
        assert await client.get(url, 2.0) == Page(200, TEXT.decode(), BODY)


async def test_a_body_that_ends_with_the_connection_comes_whole(client: MetricsClient) -> None:
    answer = b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n" + BODY
    async with serving(Script([answer], close_after=True)) as url:
        assert (await client.get(url, 2.0)).body == BODY


async def test_scrapes_share_one_kept_alive_connection_and_ask_for_plain_text(
    client: MetricsClient,
) -> None:
    script = Script([chunked()])
    async with serving(script) as url:
        for _ in range(5):
            assert (await client.get(url, 2.0)).body == BODY
    assert script.connections == 1 and len(script.requests) == 5
    request = script.requests[0].lower()
    assert request.startswith(b"get /metrics http/1.1\r\n")
    assert b"\r\nhost: 127.0.0.1:" in request and b"\r\naccept: text/plain" in request
    assert b"accept-encoding" not in request  # the engine must not spend CPU on gzip


async def test_a_connection_the_server_closed_while_idle_is_replaced(
    client: MetricsClient,
) -> None:
    script = Script([with_length()], close_after=True)
    async with serving(script) as url:
        await client.get(url, 2.0)
        await asyncio.sleep(0.05)  # the server's close arrives while the connection idles
        assert (await client.get(url, 2.0)).body == BODY
    assert script.connections == 2


async def test_a_kept_alive_connection_closed_under_the_request_is_retried_once(
    client: MetricsClient,
) -> None:
    # The server's keep-alive timeout races the scrape: it closes as the request arrives.
    script = Script([with_length(), CLOSE, with_length()])
    async with serving(script) as url:
        await client.get(url, 2.0)
        assert (await client.get(url, 2.0)).body == BODY
    assert script.connections == 2 and len(script.requests) == 3


async def test_a_new_connection_closed_without_an_answer_fails(client: MetricsClient) -> None:
    async with serving(Script([CLOSE])) as url:
        with pytest.raises(FetchError, match="without an answer"):
            await client.get(url, 2.0)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (HANG, "no answer within 0.2 s"),
        (with_length()[:-100], "mid-response"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "not HTTP/1.1"),
    ],
    ids=["hang", "cut-short", "not-http"],
)
async def test_a_failed_scrape_says_why(client: MetricsClient, answer: bytes, reason: str) -> None:
    script = Script([answer], close_after=True)
    async with serving(script) as url:
        started = time.monotonic()
        with pytest.raises(FetchError, match=reason):
            await client.get(url, 0.2)
        assert time.monotonic() - started < 1.5


async def test_a_body_beyond_the_bound_fails(
    client: MetricsClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics_http, "MAX_BODY_BYTES", 4096)
    async with serving(Script([chunked()])) as url:
        with pytest.raises(FetchError, match="over 4096 bytes"):
            await client.get(url, 2.0)


async def test_an_error_status_is_a_page_not_an_exception(client: MetricsClient) -> None:
    answer = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nbusy"
    async with serving(Script([answer])) as url:
        assert await client.get(url, 2.0) == Page(503, "", b"busy")


@pytest.mark.parametrize(
    ("url", "reason"),
    [("ftp://127.0.0.1/metrics", "not an http"), ("http://127.0.0.1:9/metrics", "cannot connect")],
)
async def test_an_endpoint_that_cannot_be_reached_fails(
    client: MetricsClient, url: str, reason: str
) -> None:
    with pytest.raises(FetchError, match=reason):
        await client.get(url, 2.0)


async def test_a_cancelled_scrape_closes_its_connection(client: MetricsClient) -> None:
    script = Script([HANG, with_length()])
    async with serving(script) as url:
        task = asyncio.create_task(client.get(url, 5.0))
        await aeventually(lambda: len(script.requests) == 1, "the request at the server")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await client.get(url, 2.0)).body == BODY  # a new connection, a clean answer
    assert script.connections == 2


async def test_dropping_an_endpoint_closes_its_idle_connection(client: MetricsClient) -> None:
    script = Script([with_length()])
    async with serving(script) as url:
        await client.get(url, 2.0)
        client.drop(url)
        await aeventually(lambda: all(t.done() for t in script.handlers), "the server sees it")
        await client.get(url, 2.0)
        client.drop("not a URL")  # nothing to drop
    assert script.connections == 2
