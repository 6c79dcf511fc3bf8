"""The local stack of ``fairq up``: every component as its own process.

Starts a private Redis (unless a URL is given), the engine simulators, a
dispatcher, workers, a batch worker (RQ) and the gateway, each a child process running the same
``fairq`` command a production pod runs. Children die with the parent (Linux
PR_SET_PDEATHSIG), and ``stop`` ends them all, so nothing is left behind. The kernel
sends that signal when the *thread* that started the child ends, so every child is
started by one thread the stack owns until ``stop`` (``fairq.stack.children``): a child
restarted from a short-lived thread (a test's ``asyncio.to_thread``) would otherwise be
stopped with it. The private Redis is started by that thread too, and dies with the stack;
it carries the stack's claim (``fairq.stack.owner``), so that no other ``fairq up`` joins
it, and ``restart_redis`` brings it back over its files if it dies first.
Tests and benchmarks use the same class; a stack of simulators alone (no
dispatcher, worker or gateway, as in a benchmark's direct arm) starts no Redis.

Each child starts with SIGINT and SIGTERM at their defaults, whatever its parent
ignores. A child's output goes to the parent's own (the default), to a file per
child (``log_dir``), or line by line to ``on_output`` (``fairq up``'s console);
``on_event`` hears each child's state changes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from broker import hash_key
from fairq.stack.answering import wait_answering
from fairq.stack.children import start_child
from fairq.stack.localredis import LocalRedis, free_port
from fairq.stack.owner import StackOwner, claim

DEMO_MODELS = ("demo-chat", "demo-code")
DEMO_BATCH_SLOTS = 32  # max_num_seqs of the simulator's default profile (fairq learns it)
DEMO_KEYS = {  # key -> (user, tenant): printed by `fairq up`, for local use only
    "fq-demo-alice": ("alice", "team-a"),
    "fq-demo-bob": ("bob", "team-b"),
}


DEMO_ADMIN_KEY = "fq-demo-admin"


def demo_api_keys() -> list[dict[str, Any]]:
    """The demo keys' entries (``DEMO_KEYS`` and the admin key ``DEMO_ADMIN_KEY``)."""
    return [
        {"sha256": hash_key(key), "user": user, "tenant": tenant}
        for key, (user, tenant) in DEMO_KEYS.items()
    ] + [{"sha256": hash_key(DEMO_ADMIN_KEY), "user": "admin", "admin": True}]


def demo_config(
    sim_ports: list[int], batch_slots: int | None = None, **overrides: Any
) -> dict[str, Any]:
    """The configuration of the demo stack: one simulated pod per demo model, each an engine
    of its own (``sim-<model>``) whose batch (``batch_slots``, its profile's max_num_seqs)
    fairq is told, or learns if None."""
    batch = {} if batch_slots is None else {"batch_slots": batch_slots}
    config: dict[str, Any] = {
        "engines": [
            {"name": f"sim-{name}", "endpoints": [f"http://127.0.0.1:{port}"], **batch}
            for name, port in zip(DEMO_MODELS, sim_ports, strict=True)
        ],
        "models": [{"name": name, "engine": f"sim-{name}"} for name in DEMO_MODELS],
        "api_keys": demo_api_keys(),
    }
    config.update(overrides)
    return config


@dataclass
class Stack:
    config: dict[str, Any]
    gateway_port: int
    sims: dict[int, str] = field(default_factory=dict)  # port -> model(s) served, comma-separated
    sim_profiles: dict[int, str] = field(default_factory=dict)  # port -> profile name or path
    redis_url: str | None = None
    workers: int = 1
    dispatchers: int = 1
    batch_workers: int = 1  # RQ batch workers (the Batch API); only with the gateway
    gateway: bool = True
    env: dict[str, str] = field(default_factory=dict)  # extra, e.g. FAIRQ_WORKER_CONCURRENCY
    log_dir: Path | None = None  # each child's stdout and stderr to <log_dir>/<name>.log
    config_file: Path | None = None  # run on this file instead of writing ``config``
    on_output: Callable[[str, str], None] | None = None  # (child, line) of each child's output
    on_event: Callable[[str, str], None] | None = None  # (component, what became of it)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # process -> its /metrics port
    _redis: LocalRedis | None = None
    _commands: dict[str, tuple[list[str], dict[str, str] | None]] = field(default_factory=dict)
    _dir: tempfile.TemporaryDirectory[str] | None = None
    _spawner: ThreadPoolExecutor | None = None  # the one thread that starts children

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def start(self, timeout_s: float = 30.0) -> Stack:
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def runs_fairq(self) -> bool:
        return self.gateway or self.workers > 0 or self.dispatchers > 0

    @property
    def config_path(self) -> Path:
        """The configuration file every child reads (``FAIRQ_CONFIG``), once started."""
        if self.config_file is not None:
            return self.config_file
        assert self._dir is not None, "the stack has not started"
        return Path(self._dir.name) / "fairq.yaml"

    def _start(self, timeout_s: float) -> None:
        self._prepare()
        for port, model in self.sims.items():
            self._spawn(f"sim-{model}", self._sim_args(port, model))
        for port, model in self.sims.items():
            self._wait_http(f"http://127.0.0.1:{port}/health", timeout_s)
            self._event(f"sim-{model}", f"ready at http://127.0.0.1:{port}")
        for i in range(self.dispatchers):
            self._spawn(f"dispatcher-{i}", ["dispatcher"], self._metrics_env(f"dispatcher-{i}"))
        for i in range(self.workers):
            self._spawn(f"worker-{i}", ["worker"], self._metrics_env(f"worker-{i}"))
        for i in range(self.batch_workers if self.gateway else 0):
            name = f"batch-worker-{i}"
            self._spawn(name, ["batch-worker"], self._metrics_env(name))
        if self.gateway:
            self._spawn("api", ["api", "--host", "127.0.0.1", "--port", str(self.gateway_port)])
            self._wait_http(f"{self.gateway_url}/readyz", timeout_s)
            self._event("api", f"ready at {self.gateway_url}")

    def _prepare(self) -> None:
        """The private Redis (claimed as this stack's once the configuration is written)
        and what every child's environment names."""
        if self.redis_url is None and self.runs_fairq:
            redis = self._redis = LocalRedis(die_with_parent=True)
            self._spawner_thread().submit(redis.start).result()
            self.redis_url = redis.url
            self._event("redis", f"ready at {self.redis_url} (private: gone at exit)")
        self._dir = tempfile.TemporaryDirectory(prefix="fairq-up-")
        if self.config_file is None:
            self.config_path.write_text(yaml.safe_dump(self.config))
        if self._redis is not None:
            self._claim_redis()
        self.env = {**os.environ, **self.env, "FAIRQ_CONFIG": str(self.config_path)}
        if self.redis_url is not None:
            self.env["FAIRQ_REDIS_URL"] = self.redis_url

    def _claim_redis(self) -> None:
        assert self.redis_url is not None
        owner = StackOwner(os.getpid(), self.gateway_url, str(self.config_path))
        claim(self.redis_url, owner)

    def redis_exit_code(self) -> int | None:
        """The private Redis's exit status once it has exited on its own; None while it
        runs, and for a stack without one."""
        process = None if self._redis is None else self._redis.process
        return None if process is None else process.poll()

    def redis_last_words(self) -> str:
        """The private Redis's last two log lines, as one line."""
        return "no private Redis" if self._redis is None else self._redis.last_words()

    def restart_redis(self, timeout_s: float = 10.0) -> None:
        """Start the private Redis again on its port over its files (what it had fsynced,
        as a pod restart would), from the thread that starts every child, so that it dies
        with the stack again; raises ``RedisServerError`` if it does not come back."""
        assert self._redis is not None, "the stack has no private Redis"
        redis = self._redis
        redis.halt()
        self._spawner_thread().submit(redis.start, timeout_s).result()
        self._claim_redis()

    def _event(self, name: str, what: str) -> None:
        if self.on_event is not None:
            self.on_event(name, what)

    def _sim_args(self, port: int, model: str) -> list[str]:
        args = ["sim", "--port", str(port)]
        for name in model.split(","):
            args += ["--model", name]
        profile = self.sim_profiles.get(port)
        return args if profile is None else [*args, "--profile", profile]

    def _metrics_env(self, name: str) -> dict[str, str]:
        """Each process its own free /metrics port on loopback (``FAIRQ_METRICS_PORT=0``
        in ``env`` turns them off)."""
        if self.env.get("FAIRQ_METRICS_PORT") == "0":
            return {}
        port = self.metrics_ports[name] = free_port()
        return {"FAIRQ_METRICS_PORT": str(port), "FAIRQ_METRICS_HOST": "127.0.0.1"}

    def metrics_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"

    def kill_and_restart(self, name: str, down_s: float = 0.0) -> None:
        """SIGKILL the child ``name`` (a crash: no cleanup runs), wait ``down_s``, start it
        again with the same command; the gateway is back once it answers /readyz."""
        process = self.processes[name]
        process.kill()
        process.wait()
        time.sleep(down_s)
        self._spawn(name, *self._commands[name])
        if name == "api":
            self._wait_http(f"{self.gateway_url}/readyz", 30.0)

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self._commands[name] = (args, env)
        log: IO[bytes] | int | None = None
        if self.log_dir is not None:
            log = (self.log_dir / f"{name.replace('/', '_')}.log").open("ab")
        elif self.on_output is not None:
            log = subprocess.PIPE
        try:
            process = self.processes[name] = (
                self._spawner_thread()
                .submit(
                    subprocess.Popen,
                    [sys.executable, "-m", "fairq", *args],
                    env={**self.env, **(env or {})},
                    stdout=log,
                    stderr=subprocess.STDOUT if log is subprocess.PIPE else log,
                    preexec_fn=start_child,
                )
                .result()
            )
        finally:
            if log is not None and not isinstance(log, int):
                log.close()  # the child has its own descriptor
        self._event(name, f"started (pid {process.pid})")
        if process.stdout is not None and self.on_output is not None:
            threading.Thread(
                target=_relay, args=(name, process.stdout, self.on_output), daemon=True
            ).start()

    def _spawner_thread(self) -> ThreadPoolExecutor:
        if self._spawner is None:
            self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairq-spawn")
        return self._spawner

    def _wait_http(self, url: str, timeout_s: float) -> None:
        if wait_answering(url, timeout_s, alive=lambda: self.dead() is None):
            return
        dead = self.dead()
        if dead:
            code = self.processes[dead].returncode
            raise RuntimeError(f"{dead} exited (code {code}) while the stack was starting")
        raise TimeoutError(f"{url} did not become ready in {timeout_s}s")

    def dead(self) -> str | None:
        """The name of a child that has exited, if any."""
        return next((n for n, p in self.processes.items() if p.poll() is not None), None)

    def stop(self, timeout_s: float = 10.0) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._spawner is not None:
            self._spawner.shutdown()
            self._spawner = None
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _relay(name: str, stream: IO[bytes], on_output: Callable[[str, str], None]) -> None:
    """Hands each line a child writes to ``on_output`` until the child closes its output."""
    with stream:
        for raw in iter(stream.readline, b""):
            on_output(name, raw.decode(errors="replace").rstrip())
