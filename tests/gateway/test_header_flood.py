"""A header flood against a real ``fairq api`` process on 127.0.0.1: headers far past
the cap (``gateway.connections.MAX_HEADER_BYTES``) get 431 before any key is checked,
and the gateway does not keep them. Without the cap httptools keeps every byte of a
request's headers until they end: a 30 MB header got 200, and a few floods held open
took hundreds of MB, of a pod's 1 GiB limit.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from fairq.stack.localredis import free_port
from tests.support import local_http
from tests.support.settings import make_config
from tests.support.stack import WorkerProcesses

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FLOODS = 4
FLOOD_BYTES = 60_000_000
# What the gateway may grow by while the floods arrive: the parser holds at most the cap
# and one read per connection; the headers kept whole would be 240 MB.
RSS_SLACK_BYTES = 8_000_000


@pytest.fixture
def gateway_process(redis_url: str) -> Iterator[tuple[str, psutil.Process]]:
    procs = WorkerProcesses(make_config(), redis_url)
    try:
        port = free_port()
        proc = procs.spawn_gateway(port)
        yield f"http://127.0.0.1:{port}", psutil.Process(proc.pid)
    finally:
        procs.close()


def flood(port: int) -> socket.socket:
    """A connection that sent one keyless request with a ``FLOOD_BYTES`` header, left open
    (a client that never goes away)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Pad: ")
    chunk = b"p" * 1_000_000
    for _ in range(FLOOD_BYTES // len(chunk)):
        sock.sendall(chunk)
    sock.sendall(b"\r\n\r\n")
    return sock


def status_of(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    return int(data.split(b" ", 2)[1])


class PeakRss:
    """The largest RSS of ``process`` while the block runs, sampled every 10 ms."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self.peak = process, process.memory_info().rss
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._sampler.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._sampler.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def test_four_60_mb_headers_get_431_and_do_not_grow_the_gateway(
    gateway_process: tuple[str, psutil.Process],
) -> None:
    url, process = gateway_process
    port = int(url.rsplit(":", 1)[1])
    for _ in range(3):  # the gateway's first requests allocate what it keeps anyway
        assert local_http.get(f"{url}/v1/models", timeout=5).status_code == 401
    before = process.memory_info().rss
    with PeakRss(process) as rss, ThreadPoolExecutor(FLOODS) as pool:
        socks = list(pool.map(lambda _: flood(port), range(FLOODS)))
    try:
        grown = rss.peak - before
        assert grown < RSS_SLACK_BYTES, f"the gateway grew by {grown / 1e6:.1f} MB"
        assert [status_of(sock) for sock in socks] == [431] * FLOODS
    finally:
        for sock in socks:
            sock.close()
    assert local_http.get(f"{url}/healthz", timeout=5).status_code == 200
