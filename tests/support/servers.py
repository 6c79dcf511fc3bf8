"""Servers on 127.0.0.1 for tests: an ASGI app under a real uvicorn in a thread, a TCP
server that never answers, and the end of a scripted server's connections (``stop``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import uvicorn

from tests.support.eventually import eventually

START_STOP_S = 10.0


@contextlib.contextmanager
def uvicorn_thread(app: Any, *, lifespan: str = "on") -> Iterator[str]:
    """``app`` served on a free loopback port; yields its base URL, stops it after."""
    sock = free_socket()
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan=lifespan)
    with running(uvicorn.Server(config), sock):
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def free_socket() -> socket.socket:
    """A socket bound to a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def running(server: uvicorn.Server, sock: socket.socket) -> Iterator[threading.Thread]:
    """``server`` on ``sock`` in a thread, started; stopped (and ``sock`` closed) after."""
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "the server's thread ended before it started"
        return server.started

    eventually(started, "the server to start", START_STOP_S, interval_s=0.01)
    try:
        yield thread
    finally:
        server.should_exit = True
        thread.join(START_STOP_S)
        sock.close()
        assert not thread.is_alive(), "server did not shut down"


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A TCP server on 127.0.0.1 that takes every byte and never answers (a hung Redis);
    yields its ``redis://`` URL."""
    connections: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.close()
        for writer in connections:
            writer.close()
        await server.wait_closed()


async def stop(writers: list[asyncio.StreamWriter], handlers: list[asyncio.Task[Any]]) -> None:
    """End the server's connections: closed, their handlers see the end and return; one
    still waiting (a hang) is cancelled."""
    for writer in writers:
        writer.close()
    if handlers:
        _, pending = await asyncio.wait(handlers, timeout=1.0)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
