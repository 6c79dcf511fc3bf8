"""The machine's floor for one wake-up: CPU an idle asyncio process spends per message.

At ~50 tokens/s per stream and few streams, every token wakes the worker and the
gateway from sleep, and what a wake-up costs depends on the machine (a virtual
machine's timer and interrupt exits are charged to the process that wakes). This
measures it apart from fairq: a child process on uvloop, as fairq's processes run,
echoes one-byte messages that arrive every ``period_s`` over a socket pair; its own
CPU counters divided by the messages it echoed is the floor a hop pays per token
when each token arrives alone.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import time
from multiprocessing.connection import Connection


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


async def _echo(sock: socket.socket) -> tuple[int, float]:
    reader, writer = await asyncio.open_connection(sock=sock)
    started, echoed = _cpu_s(), 0
    while data := await reader.read(64):
        echoed += 1
        writer.write(data)
    return echoed, _cpu_s() - started


def _child(sock: socket.socket, parent_end: socket.socket, report: Connection) -> None:
    parent_end.close()  # inherited by the fork: EOF comes only once every copy is closed
    try:
        import uvloop

        echoed, spent = uvloop.run(_echo(sock))
    except ImportError:
        echoed, spent = asyncio.run(_echo(sock))
    report.send((echoed, spent))


def wakeup_floor_us(period_s: float = 0.02, messages: int = 250) -> float:
    """CPU µs the echoing process spends per message, messages ``period_s`` apart."""
    ours, theirs = socket.socketpair()
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_child, args=(theirs, ours, send))
    child.start()
    theirs.close()
    for _ in range(messages):
        ours.send(b"x")
        ours.recv(64)
        time.sleep(period_s)
    ours.close()
    echoed, spent = receive.recv()
    child.join(10)
    return spent * 1e6 / max(echoed, 1)
