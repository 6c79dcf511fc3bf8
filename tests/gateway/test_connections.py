"""The gateway's connection limits (``gateway.connections``), tried with raw sockets on
127.0.0.1 against the gateway served as ``fairq api`` serves it: slow headers, headers
past their cap, a body that stops, idle and keep-alive connections, more connections
than the cap, and bodies sent whole past their 413 (raw, through httpx and through the
official openai client).

Timeouts are cut to fractions of a second here; the defaults are in
``broker.settings.HttpSettings`` and docs/operations.md.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest
from openai._constants import DEFAULT_CONNECTION_LIMITS

from broker.settings import HttpSettings
from gateway import create_app, gateway_config
from gateway.connections import MAX_HEADER_BYTES
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.settings import ALICE, ALICE_KEY, MODEL, make_settings
from tests.support.stack import gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

SHORT_S = 0.5
TEN_MB = 10_000_000
LIMITS = {"header_timeout_s": SHORT_S, "body_timeout_s": SHORT_S, "keep_alive_s": SHORT_S}
CHAT_HEAD = (
    "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
    "Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
)


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    with gateway(make_settings(redis_url, http=LIMITS, max_body_bytes=4096)) as base:
        yield base


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_to_close(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    start, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def read_one_response(sock: socket.socket) -> bytes:
    """One whole response (its headers, then Content-Length bytes of body): the server may
    send them in separate segments, which one ``recv`` would split."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += _more(sock, data)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = (line.partition(b":") for line in head.split(b"\r\n")[1:])
    length = int({name.strip().lower(): value for name, _, value in fields}[b"content-length"])
    while len(body) < length:
        body += _more(sock, head + body)
    return head + b"\r\n\r\n" + body


def _more(sock: socket.socket, so_far: bytes) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        pytest.fail(f"the server closed the connection mid-response: {so_far!r}")
    return chunk


def response(data: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    """Status, headers and JSON body of one HTTP response."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, orjson.loads(body)


def chat_body(size: int) -> bytes:
    """A chat request ``size`` bytes long (a long prompt)."""
    start = b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "'
    end = b'"}]}'
    return start + b"x" * (size - len(start) - len(end)) + end


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(url: str) -> None:
    with connect(url) as sock:
        data, waited = read_to_close(sock)
    assert data == b"" and SHORT_S * 0.9 <= waited < SHORT_S + 2


def test_headers_sent_slowly_get_408_at_the_header_timeout_however_they_trickle(
    url: str,
) -> None:
    with connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")
        sock.settimeout(0.1)
        start, data = time.monotonic(), b""
        with contextlib.suppress(ConnectionError):
            while not data and time.monotonic() - start < 5:  # a header line every 0.1 s
                sock.sendall(b"X-Drip: 1\r\n")
                with contextlib.suppress(TimeoutError):
                    data = sock.recv(65536)
        sock.settimeout(10)
        data += read_to_close(sock)[0]
    status, headers, body = response(data)
    assert status == 408 and headers["connection"] == "close"
    assert body["error"]["code"] == "request_timeout"  # type: ignore[index]
    assert time.monotonic() - start < SHORT_S + 2


def test_a_keep_alive_request_gets_its_own_header_deadline(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert read_one_response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and no more
        data, waited = read_to_close(sock)
    assert response(data)[0] == 408 and waited < SHORT_S + 2


def head_with(padding: int) -> bytes:
    """A keyless ``GET /v1/models`` (a 401 once read) with a header ``padding`` bytes long."""
    return b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Pad: " + b"p" * padding + b"\r\n\r\n"


@pytest.mark.parametrize("padding", [MAX_HEADER_BYTES + 1, 100_000, 4_000_000])
def test_headers_past_the_cap_get_431_before_the_key_is_checked(url: str, padding: int) -> None:
    with connect(url) as sock:
        sock.sendall(head_with(padding))  # all of it before reading: no broken pipe
        status, headers, body = response(read_to_close(sock)[0])
    assert status == 431 and headers["connection"] == "close"
    assert body["error"]["code"] == "headers_too_large"  # type: ignore[index]
    assert local_http.get(f"{url}/healthz", timeout=5).status_code == 200


def test_headers_that_never_end_get_431_once_past_the_cap_not_at_the_timeout(url: str) -> None:
    # The gateway stops reading them at the cap: parsed on, they would all be kept.
    with connect(url) as sock:
        sock.sendall(head_with(4 * MAX_HEADER_BYTES)[:-4])  # no blank line: they go on
        start = time.monotonic()
        status, _, body = response(read_one_response(sock))
        assert time.monotonic() - start < SHORT_S * 0.9  # not the header timeout's 408
    assert status == 431 and body["error"]["code"] == "headers_too_large"  # type: ignore[index]


def test_a_431_whose_body_never_comes_is_the_only_answer(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(head_with(MAX_HEADER_BYTES + 1).replace(b"GET", b"POST").replace(
            b"\r\n\r\n", b"\r\nContent-Length: 100\r\n\r\n"))  # fmt: skip
        data, waited = read_to_close(sock)  # closed at the body timeout, without a 408
    assert data.count(b"HTTP/1.1") == 1 and response(data)[0] == 431
    assert waited < SHORT_S + 2


def test_headers_just_under_the_cap_are_read_as_usual(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(head_with(MAX_HEADER_BYTES - 1024))
        assert response(read_one_response(sock))[0] == 401  # read whole: the key is missing


def test_a_body_that_stops_arriving_gets_408(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(CHAT_HEAD.format(key=ALICE_KEY, length=100).encode() + b'{"model"')
        data, waited = read_to_close(sock)
    status, _, body = response(data)
    assert status == 408 and "body" in body["error"]["message"]  # type: ignore[index]
    assert SHORT_S * 0.9 <= waited < SHORT_S + 2


def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_s(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert read_one_response(sock).startswith(b"HTTP/1.1 200")
        data, waited = read_to_close(sock)
    assert data == b"" and SHORT_S * 0.9 <= waited < SHORT_S + 2


def test_keep_alive_outlasts_the_pools_of_httpx_and_the_openai_client() -> None:
    """A server that closes an idle connection when the client's pool still holds it fresh
    races the client's next request on it (about 1 in 1,000 requests of a flood failed)."""
    settings = make_settings()
    config = gateway_config(create_app(settings), settings, "127.0.0.1", 0)
    expiry = max(
        httpx.Limits().keepalive_expiry or 0, DEFAULT_CONNECTION_LIMITS.keepalive_expiry or 0
    )
    assert config.timeout_keep_alive == HttpSettings().keep_alive_s >= 10 * expiry


def test_hundreds_of_idle_and_half_sent_connections_are_all_closed(url: str) -> None:
    socks = [connect(url) for _ in range(300)]
    for sock in socks[::2]:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
    assert local_http.get(f"{url}/healthz", timeout=5).status_code == 200
    try:
        for sock in socks:
            assert read_to_close(sock)[1] < SHORT_S + 5
    finally:
        for sock in socks:
            sock.close()


def test_a_connection_beyond_the_cap_gets_503_and_others_are_served(redis_url: str) -> None:
    settings = make_settings(redis_url, http={"max_connections": 3})
    with gateway(settings) as url, contextlib.ExitStack() as held:
        for _ in range(3):
            held.enter_context(connect(url))
        with connect(url) as extra:
            extra.sendall(CHAT_HEAD.format(key=ALICE_KEY, length=1000).encode() + b"x" * 1000)
            status, headers, body = response(read_to_close(extra)[0])
        assert status == 503 and headers["retry-after"] == "1"
        assert body["error"]["code"] == "too_many_connections"  # type: ignore[index]
        held.close()  # three connections fewer: the next is served
        eventually(
            lambda: local_http.get(f"{url}/healthz", timeout=5).status_code == 200,
            "a connection under the cap served",
            ignoring=(httpx.TransportError,),
        )


def test_a_10_mb_body_sent_whole_gets_its_413_and_the_connection_stays_usable(url: str) -> None:
    with connect(url) as sock:
        sock.sendall(CHAT_HEAD.format(key=ALICE_KEY, length=TEN_MB).encode())
        sock.sendall(chat_body(TEN_MB))  # all of it before reading: no broken pipe
        answer = read_one_response(sock)
        assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" not in answer
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert read_one_response(sock).startswith(b"HTTP/1.1 200")


def test_a_body_past_the_discard_bound_is_cut_off(redis_url: str) -> None:
    limits = {"discard_body_bytes": 1 << 20}
    settings = make_settings(redis_url, http=limits, max_body_bytes=4096)
    with gateway(settings) as url, connect(url) as sock:
        sock.sendall(CHAT_HEAD.format(key=ALICE_KEY, length=TEN_MB).encode())
        with pytest.raises(ConnectionError):
            sock.sendall(chat_body(TEN_MB))


def test_a_10_mb_body_gets_its_413_through_httpx(url: str) -> None:
    with httpx.Client(base_url=url, headers=ALICE, timeout=10) as client:
        for _ in range(3):  # on one pooled connection
            reply = client.post("/v1/chat/completions", content=chat_body(TEN_MB))
            assert reply.status_code == 413
            assert reply.json()["error"]["code"] == "request_too_large"


def test_a_10_mb_body_gets_its_413_through_the_openai_client_without_retries(url: str) -> None:
    sent: list[httpx.Request] = []
    http = httpx.Client(event_hooks={"request": [sent.append]}, timeout=10)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=ALICE_KEY, http_client=http)
    with client, pytest.raises(openai.APIStatusError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x" * TEN_MB}]
        )
    assert raised.value.status_code == 413 and len(sent) == 1
