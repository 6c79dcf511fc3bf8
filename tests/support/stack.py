"""Parts of a fairq stack for the tests, each started one way.

The engine simulator and the gateway run under real uvicorn servers in threads (``sim``,
``gateway``); the dispatcher and workers either in this event loop (``components``) or
as real ``fairq worker`` subprocesses (``WorkerProcesses``, for SIGKILL); a whole stack
of real processes is ``fairq up``'s own ``Stack``, on free ports (``demo_stack``).
Everything talks to a real Redis on 127.0.0.1. Configurations come from
tests/support/settings.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from broker import Settings, connect, connect_blocking, keys
from dispatcher.service import Dispatcher
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config
from gateway import create_app, gateway_config
from sim import SimProfile
from sim import create_app as create_sim
from tests.support import local_http
from tests.support.eventually import WAIT_S, eventually
from tests.support.processes import ProcessGroups
from tests.support.servers import free_socket, running, uvicorn_thread
from tests.support.settings import MODEL
from workers.service import Worker

# Fast steps: a token every ~2 ms, so a test's stream of a few dozen tokens is quick.
FAST = SimProfile(step_base_ms=2.0, step_per_seq_ms=0.05, default_output_tokens=8)


@contextlib.contextmanager
def sim(profile: SimProfile = FAST, models: Sequence[str] = (MODEL,)) -> Iterator[str]:
    """A simulated engine serving ``models``; yields its base URL."""
    with uvicorn_thread(create_sim(list(models), profile)) as url:
        yield url


@contextlib.contextmanager
def gateway(settings: Settings) -> Iterator[str]:
    """The gateway of ``settings``, served as ``fairq api`` serves it (its uvicorn settings
    and connection limits); yields its base URL."""
    app = create_app(settings)
    sock = free_socket()
    port = sock.getsockname()[1]
    with running(uvicorn.Server(gateway_config(app, settings, "127.0.0.1", port)), sock):
        yield f"http://127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def components(
    settings: Settings, *, dispatcher: bool = True, workers: int = 1
) -> AsyncIterator[list[Worker]]:
    """A dispatcher and ``workers`` workers running in this event loop until the block ends."""
    stop = asyncio.Event()
    redis = connect(settings)
    blockings = [connect_blocking(settings, block_s=1.0) for _ in range(workers)]
    running = [Worker(settings, redis, blocking) for blocking in blockings]
    tasks = [asyncio.create_task(w.run(stop)) for w in running]
    if dispatcher:
        tasks.append(asyncio.create_task(Dispatcher(settings, redis).run(stop)))
    try:
        yield running
    finally:
        stop.set()
        done, pending = await asyncio.wait(tasks, timeout=WAIT_S)
        assert not pending, f"components did not stop: {[_awaiting(t) for t in pending]}"
        for task in done:
            task.result()
        for client in [*blockings, redis]:
            await client.aclose()


def _awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where a task waits: its chain of awaited coroutines (for a readable failure)."""
    chain, coro = [], task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None)
        chain.append(f"{getattr(coro, '__qualname__', coro)}:{frame.f_lineno if frame else ''}")
        coro = getattr(coro, "cr_await", None)
    return chain


async def job_field(redis: Redis, job_id: str, field: str) -> str | None:
    value = await redis.hget(keys.job(MODEL, job_id), field)
    return value.decode() if value is not None else None


async def state_is(redis: Redis, job_id: str, state: str, attempts: int | None = None) -> bool:
    """Whether the job is in ``state`` (and at its ``attempts``-th start, if given)."""
    if await job_field(redis, job_id, "st") != state:
        return False
    return attempts is None or await job_field(redis, job_id, "att") == str(attempts)


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], **extra}


def contents(raw: bytes) -> list[str]:
    """The delta contents of every chunk event in an SSE body, in order."""
    import orjson

    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {") and b'"choices"' in line:
            choices = orjson.loads(line[6:])["choices"]
            if choices and "content" in choices[0].get("delta", {}):
                out.append(choices[0]["delta"]["content"])
    return out


def metric(url: str, name: str, **labels: str) -> float:
    """A sample's value from a Prometheus endpoint (0 when it is not there)."""
    for family in text_string_to_metric_families(local_http.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


class WorkerProcesses:
    """Real ``fairq worker`` (or ``fairq api``) subprocesses sharing one configuration."""

    def __init__(self, settings_config: dict[str, Any], redis_url: str) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="fairq-crash-")
        path = Path(self._dir.name) / "fairq.yaml"
        path.write_text(yaml.safe_dump(settings_config))
        self._env = {**os.environ, "FAIRQ_CONFIG": str(path), "FAIRQ_REDIS_URL": redis_url,
                     "FAIRQ_LOG_LEVEL": "WARNING", "FAIRQ_METRICS_PORT": "0"}  # fmt: skip
        self.procs: list[subprocess.Popen[bytes]] = []
        self._groups = ProcessGroups()  # each its own process group, killed whole at close

    def spawn(self, metrics_port: int | None = None) -> subprocess.Popen[bytes]:
        env = dict(self._env)
        if metrics_port is not None:
            env["FAIRQ_METRICS_PORT"] = str(metrics_port)
            env["FAIRQ_METRICS_HOST"] = "127.0.0.1"
        return self.run(["worker"], env)

    def spawn_gateway(self, port: int) -> subprocess.Popen[bytes]:
        """``fairq api`` on ``port``; returns once it answers /readyz."""
        proc = self.run(["api", "--host", "127.0.0.1", "--port", str(port)], self._env)
        wait_healthy(f"http://127.0.0.1:{port}/readyz", proc, "the gateway")
        return proc

    def spawn_batch_worker(self) -> subprocess.Popen[bytes]:
        return self.run(["batch-worker"], self._env)

    def run(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = self._groups.start(
            [sys.executable, "-m", "fairq", *args], env=env
        )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        self._groups.kill_all()
        self._dir.cleanup()


def wait_healthy(
    url: str, process: subprocess.Popen[Any], name: str, timeout_s: float = WAIT_S
) -> None:
    """Until ``url`` answers 200; fails at once if ``process`` (``name``) exits first."""

    def healthy() -> bool:
        assert process.poll() is None, f"{name} exited before it was ready"
        return local_http.get(url, timeout=1).status_code == 200

    what = f"{name} to answer {url}"
    eventually(healthy, what, timeout_s, interval_s=0.05, ignoring=(httpx.TransportError,))


def demo_stack(
    *,
    per_model: Mapping[str, Mapping[str, Any]] | None = None,
    profile: str | Path | None = None,
    batch_slots: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Stack:
    """``fairq up``'s demo stack on free ports, to start with ``with``: one simulator per
    demo model (all with ``profile``, if given) and ``demo_config`` plus ``overrides``, with
    ``per_model`` added to a model's entry by name. ``fields`` are ``Stack``'s
    (``redis_url``, ``gateway``, ``workers``, ``env``, ...)."""
    ports = [free_port() for _ in DEMO_MODELS]
    config = demo_config(ports, batch_slots, **(overrides or {}))
    for entry in config["models"]:
        entry.update((per_model or {}).get(entry["name"], {}))
    profiles = {} if profile is None else dict.fromkeys(ports, str(profile))
    gateway_port = free_port() if fields.get("gateway", True) else 0
    sims = dict(zip(ports, DEMO_MODELS, strict=True))
    return Stack(config, gateway_port=gateway_port, sims=sims, sim_profiles=profiles, **fields)


def sim_port(stack: Stack, model: str) -> int:
    """The port of the simulator that serves ``model`` in ``stack``."""
    return next(port for port, served in stack.sims.items() if model in served.split(","))
