"""Parts of a fairq stack for the guarantee tests (crash, faults, deadlines, resume).

The engine simulator and the gateway run under real uvicorn servers in threads;
the dispatcher and workers either in this event loop (``components``) or as real
``fairq worker`` subprocesses (``spawn_worker``, for SIGKILL). Everything talks
to the session's real Redis on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from broker import Settings, connect, connect_blocking, hash_key, keys
from dispatcher.service import Dispatcher
from gateway import create_app
from tests.support.servers import uvicorn_thread
from workers.service import Worker
from workers.sim import SimProfile
from workers.sim import create_app as create_sim

MODEL = "tiny"
ALICE_KEY, BOB_KEY, ADMIN_KEY = "k-alice", "k-bob", "k-admin"
ALICE = {"Authorization": f"Bearer {ALICE_KEY}"}
BOB = {"Authorization": f"Bearer {BOB_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
# Fast steps: a token every ~2 ms, so a test's stream of a few dozen tokens is quick.
FAST = SimProfile(step_base_ms=2.0, step_per_seq_ms=0.05, default_output_tokens=8)
WAIT_S = 15.0

# Small leases and timeouts, so each test takes seconds.
QUICK: dict[str, Any] = {
    "lease_ms": 800,
    "lease_renew_ms": 150,
    "retry_backoff_ms": 20.0,
    "engine_max_tries": 3,
    "engine_stream_idle_timeout_s": 30.0,
    "engine_read_timeout_s": 30.0,
    "worker_drain_timeout_s": 1.0,
    "stream_resume_grace_s": 1.0,
    "deadline_sweep_s": 0.1,
    "scrape_interval_s": 0.05,
}


def config(endpoint: str, **overrides: Any) -> dict[str, Any]:
    """A one-model configuration whose engine is at ``endpoint``, plus ``QUICK``."""
    model = {"name": MODEL, "engine": "vllm", "endpoints": [endpoint], "admission": "static"}
    return {
        "models": [model],
        "api_keys": [
            {"sha256": hash_key(ALICE_KEY), "user": "alice"},
            {"sha256": hash_key(BOB_KEY), "user": "bob"},
            {"sha256": hash_key(ADMIN_KEY), "user": "admin", "admin": True},
        ],
        **QUICK,
        **overrides,
    }


def settings_for(redis_url: str, endpoint: str, **overrides: Any) -> Settings:
    return Settings(redis_url=redis_url, **config(endpoint, **overrides))


@contextlib.contextmanager
def sim(profile: SimProfile = FAST) -> Iterator[str]:
    """A simulated engine serving ``MODEL``; yields its base URL."""
    with uvicorn_thread(create_sim([MODEL], profile)) as url:
        yield url


@contextlib.contextmanager
def gateway(settings: Settings) -> Iterator[str]:
    with uvicorn_thread(create_app(settings)) as url:
        yield url


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


async def wait_until(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; returns it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def job_field(redis: Redis, job_id: str, field: str) -> str | None:
    value = await redis.hget(keys.job(MODEL, job_id), field)
    return value.decode() if value is not None else None


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
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
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

    def spawn(self, metrics_port: int | None = None) -> subprocess.Popen[bytes]:
        env = dict(self._env)
        if metrics_port is not None:
            env["FAIRQ_METRICS_PORT"] = str(metrics_port)
            env["FAIRQ_METRICS_HOST"] = "127.0.0.1"
        return self.run(["worker"], env)

    def spawn_gateway(self, port: int) -> subprocess.Popen[bytes]:
        """``fairq api`` on ``port``; returns once it answers /readyz."""
        proc = self.run(["api", "--host", "127.0.0.1", "--port", str(port)], self._env)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the gateway exited"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    return proc
            time.sleep(0.05)
        raise TimeoutError("the gateway did not become ready")

    def run(self, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "fairq", *args], env=env)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self._dir.cleanup()
