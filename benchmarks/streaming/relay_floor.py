"""The floor under the two hops: what a bare relay spends per token at the same concurrency.

fairq's worker reads each token from the engine's socket and the gateway writes it to
the client's socket; between them Redis carries many tokens per call. That socket
work, one read and one write per token per stream, each behind a task wake-up on
the event loop, is what no Python relay avoids. This measures it apart from fairq
and from HTTP: a child process on uvloop relays ``streams`` TCP connections (a task
per stream: ``read``, then ``write``) from a sender that emits one vLLM-sized chunk
per stream every ``period_s`` to a sink that drains them. The relay's own CPU
counters divided by the chunks it relayed is the floor the two hops share per token.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import time
from multiprocessing.connection import Connection

# One token's event as vLLM sends it (see ../shared/fixtures): the size decides the copy.
CHUNK = (
    b'data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk",'
    b'"created":1732000000,"model":"demo","choices":[{"index":0,"delta":'
    b'{"content":" token"},"logprobs":null,"finish_reason":null}]}\n\n'
)


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


def _listener() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    return sock


async def _relay(listening: socket.socket, sink_port: int, streams: int) -> tuple[int, float]:
    relayed = 0
    accepted: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    async def forward(reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        nonlocal relayed
        while data := await reader.read(65536):
            relayed += len(data)
            out.write(data)
        out.close()

    server = await asyncio.start_server(on_connect, sock=listening)
    outs = [(await asyncio.open_connection("127.0.0.1", sink_port))[1] for _ in range(streams)]
    pairs = [await accepted.get() for _ in range(streams)]
    started = _cpu_s()
    readers = [reader for reader, _ in pairs]
    await asyncio.gather(*(forward(r, out) for r, out in zip(readers, outs, strict=True)))
    spent = _cpu_s() - started
    server.close()
    return relayed // len(CHUNK), spent


async def _drain(listening: socket.socket, streams: int) -> None:
    done = asyncio.Event()
    left = streams

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal left
        while await reader.read(65536):
            pass
        writer.close()
        left -= 1
        if not left:
            done.set()

    server = await asyncio.start_server(on_connect, sock=listening)
    await done.wait()
    server.close()


def _run(main: object) -> object:
    try:
        import uvloop

        return uvloop.run(main)  # type: ignore[arg-type]
    except ImportError:
        return asyncio.run(main)  # type: ignore[arg-type]


def _relay_child(
    listening: socket.socket, sink_port: int, streams: int, report: Connection
) -> None:
    report.send(_run(_relay(listening, sink_port, streams)))


def _sink_child(listening: socket.socket, streams: int) -> None:
    _run(_drain(listening, streams))


def relay_floor_us(streams: int, seconds: float = 4.0, period_s: float = 0.02) -> float:
    """CPU µs the bare relay spends per chunk, each of ``streams`` sending every ``period_s``."""
    fork = multiprocessing.get_context("fork")
    sink_sock, relay_sock = _listener(), _listener()
    sink = fork.Process(target=_sink_child, args=(sink_sock, streams))
    sink.start()
    receive, send = fork.Pipe(duplex=False)
    relay_args = (relay_sock, sink_sock.getsockname()[1], streams, send)
    relay = fork.Process(target=_relay_child, args=relay_args)
    relay.start()
    sink_sock.close()
    senders = [socket.create_connection(relay_sock.getsockname()) for _ in range(streams)]
    relay_sock.close()
    start = time.monotonic()
    for step in range(int(seconds / period_s)):
        for sender in senders:
            sender.sendall(CHUNK)
        time.sleep(max(0.0, start + (step + 1) * period_s - time.monotonic()))
    for sender in senders:
        sender.close()
    chunks, spent = receive.recv()
    relay.join(10)
    sink.join(10)
    return float(spent * 1e6 / max(chunks, 1))
