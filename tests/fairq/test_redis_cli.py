"""``fairq redis``: only the private Redis, in the foreground; it prints its URL and the
export line, serves until Ctrl-C or SIGTERM, then stops the server, deletes its files and
exits 0; a port already taken is one line and exit 1."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis

from fairq.stack.localredis import LocalRedis, free_port
from tests.support.cli import RUN_S, fairq
from tests.support.processes import ProcessGroups

_URL = re.compile(r"ready at (redis://127\.0\.0\.1:(\d+)/0)")


def _start(processes: ProcessGroups, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    return processes.start(
        [sys.executable, "-m", "fairq", "redis", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(lambda p: os.killpg(p.pid, signal.SIGINT), id="ctrl-c-at-the-terminal"),
        pytest.param(lambda p: p.send_signal(signal.SIGTERM), id="sigterm"),
    ],
)
def test_it_serves_a_redis_with_its_url_and_stops_it_cleanly(
    stop: Callable[[subprocess.Popen[str]], None], processes: ProcessGroups
) -> None:
    command = _start(processes)
    assert command.stdout is not None
    first = command.stdout.readline()
    found = _URL.search(first)
    assert found, first
    url = found[1]
    assert command.stdout.readline().strip() == "in each shell that runs a component:"
    assert command.stdout.readline().strip() == f"export FAIRQ_REDIS_URL={url}"
    client = redis.Redis.from_url(url)
    assert client.set("k", "v") and client.get("k") == b"v"
    data = Path(client.config_get("dir")["dir"])
    client.close()
    (server,) = psutil.Process(command.pid).children()
    assert data.is_dir()

    stop(command)  # a Ctrl-C reaches the whole group: the server ignores it, fairq stops it
    rest, _ = command.communicate(timeout=RUN_S)
    assert command.returncode == 0, rest
    assert rest.splitlines() == ["fairq redis: stopping", "fairq redis: stopped"]
    assert not server.is_running()
    assert not data.exists()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()


def test_a_port_in_use_is_one_line_and_exit_1() -> None:
    port = free_port()
    with socket_held(port):
        done = fairq("redis", "--port", str(port))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert "redis server exited at start" in lines[0] and "Address already in use" in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_port_held_by_another_redis_is_not_taken_for_its_own() -> None:
    # That other server answers PING on the port too; the new one must not call it its own.
    with LocalRedis() as other:
        done = fairq("redis", "--port", str(other.port))
    assert done.returncode == 1, done.stdout
    assert "Address already in use" in done.stderr
    assert "ready at" not in done.stdout


@contextlib.contextmanager
def socket_held(port: int) -> Iterator[None]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        yield
