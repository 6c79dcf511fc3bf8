"""Streaming fan-out: many concurrent streaming clients on one gateway process.

The clients stream chat completions through one gateway. The jobs are run by a
producer process that plays a worker whose engine costs nothing: it claims the
ready entries and writes one token per job every engine step through the
worker's own ``ResultWriter`` (so the result streams look exactly as a worker
makes them), then ends each job with ``complete.lua``. A simulator with one
token per chunk could not feed a thousand streams at ~50 tokens/s on this
machine; the producer leaves the cores to the gateway, Redis and the clients.

Measured: tokens/s the clients received, inter-token delay at the client
against the producer's step (the added delay), the gateway's CPU per 1,000
tokens, and the Redis connections the gateway holds, from ``CLIENT LIST``
(matched to the gateway's sockets) at the busiest moment.

Run through ``python -m benchmarks.streaming.hot_path --fanout N``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from typing import Any

import click
import psutil
import redis
from redis.asyncio import Redis as AsyncRedis

from benchmarks.lib.stats import cpu_seconds, markdown_table, median, pct
from benchmarks.streaming.client import Load, run_load
from broker import Claimed, ExecutionStore, JobState, Outcome, Settings, keys, lean_link
from broker.redis.connect import connect
from broker.settings import load_settings
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config
from workers.writer import ResultWriter

KEY = "fq-demo-alice"
STEP_MS = 20.0
_CHUNK = (
    b'data: {"id":"chatcmpl-f","object":"chat.completion.chunk","created":0,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":" word"},"finish_reason":%s}]}\n\n'
)


class Producer:
    """Claims jobs and writes ``tokens`` tokens to each, one per step, as a worker would."""

    def __init__(self, settings: Settings, tokens: int, step_ms: float) -> None:
        self._settings = settings
        self._tokens = tokens
        self._step_s = step_ms / 1000
        self._redis = connect(settings)  # a blocking pool: a burst of starts waits its turn
        # The worker's lean connection for result writes (``broker.redis.resp``).
        self._store = ExecutionStore(self._redis, settings, lean_link(settings))
        self._writer = ResultWriter(self._store, settings.stream_linger_ms)
        self._active: dict[str, tuple[Claimed, int]] = {}  # job id -> (job, tokens written)
        self._ends: set[asyncio.Task[bool]] = set()

    async def run(self) -> None:
        models = [m.name for m in self._settings.models]
        await self._store.ensure_groups(models)
        await self._store.load_scripts()
        blocking = AsyncRedis.from_url(self._settings.require_redis_url())
        writer = asyncio.create_task(self._writer.run())
        steps = asyncio.create_task(self._steps())
        while True:
            claimed = await self._store.claim(blocking, models, "producer", 1000, 1000)
            started = await asyncio.gather(*(self._store.start(j, "producer") for j in claimed))
            for job, attempt in zip(claimed, started, strict=True):
                if attempt is not None:
                    self._active[job.job_id] = (job, 0)
            if writer.done() or steps.done():
                raise RuntimeError("the producer's writer or step loop stopped")

    async def _steps(self) -> None:
        """One token per active job per step, on the step's clock (as an engine would)."""
        next_at = time.perf_counter()
        while True:
            next_at += self._step_s
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            for job_id, (job, written) in list(self._active.items()):
                last = written + 1 == self._tokens
                chunk = _CHUNK % (b'"length"' if last else b"null")
                self._writer.chunk(job, chunk, first=written == 0)
                if last:
                    del self._active[job_id]
                    self._end(job)
                else:
                    self._active[job_id] = (job, written + 1)

    def _end(self, job: Claimed) -> None:
        usage = {"prompt_tokens": 4, "completion_tokens": self._tokens,
                 "total_tokens": 4 + self._tokens}  # fmt: skip
        outcome = Outcome(JobState.COMPLETED, usage=usage, finish_reason="length")
        task = asyncio.create_task(self._writer.finish(job, outcome))
        self._ends.add(task)
        task.add_done_callback(self._ends.discard)


def ttft_split(redis_url: str, model: str, sample: int = 2000) -> dict[str, float]:
    """Where the first token's wait went, from the jobs' own times (ms, medians over up to
    ``sample`` jobs): queued (``td - tq``: enqueued to dispatched) and dispatched to
    started (``tr - td``: the producer claimed it; its first token follows within a step).
    The rest of a client's TTFT is the gateway's: request to enqueue, and the first
    token to the client."""
    queued, to_start = [], []
    with redis.Redis.from_url(redis_url) as r:
        names = list(itertools.islice(r.scan_iter(match=keys.job_pattern(model), count=1000),
                                      sample))  # fmt: skip
        with r.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hmget(name, "tq", "td", "tr")
            rows = pipe.execute()
    for tq, td, tr in rows:
        if tq and td and tr:
            queued.append(int(td) - int(tq))
            to_start.append(int(tr) - int(td))
    return {"jobs": len(queued), "queued_p50_ms": median(queued),
            "dispatched_to_started_p50_ms": median(to_start)}  # fmt: skip


def gateway_redis_connections(redis_url: str, gateway_pid: int) -> int:
    """Connections in Redis's CLIENT LIST whose address is one of the gateway's sockets."""
    mine = {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process(gateway_pid).net_connections()
            if c.raddr}  # fmt: skip
    with redis.Redis.from_url(redis_url) as r:
        return sum(1 for client in r.client_list() if client["addr"] in mine)


async def _measure(
    url: str, body: dict[str, Any], streams: int, *, seconds: float, settle_s: float,
    stagger_s: float, pids: dict[str, int], watch: Any,
) -> dict[str, Any]:  # fmt: skip
    """Run the clients; after ``settle_s`` (all streams started) take CPU and tokens over
    the rest, and sample the gateway's Redis connections (the most seen)."""
    load = Load(window_start=time.perf_counter() + settle_s)
    task = asyncio.create_task(
        run_load(
            url, body, KEY, streams, seconds=seconds + settle_s, load=load, stagger_s=stagger_s
        )
    )
    await asyncio.sleep(settle_s)
    before, most, start = cpu_seconds(pids), 0, time.perf_counter()
    for _ in range(4):
        await asyncio.sleep(seconds / 4)
        most = max(most, await asyncio.to_thread(watch))
    spent = {name: cpu - before[name] for name, cpu in cpu_seconds(pids).items()}
    tokens, elapsed = load.window_tokens, time.perf_counter() - start
    await task
    return {"load": load, "tokens": tokens, "cpu_s": spent, "redis_connections": most,
            "seconds": elapsed}  # fmt: skip


def run(streams: int, seconds: float, tokens: int) -> dict[str, Any]:
    # The clients' first requests spread over one request's streaming time: arrivals as
    # steady as a service's, not 1,000 at once every 2 s (closed-loop clients keep a wave).
    stagger_s = tokens * STEP_MS / 1000
    settle_s = stagger_s + 2.0 + streams / 200  # every client has submitted and streams by then
    ports = [free_port(), free_port()]
    config = demo_config(ports)
    config["models"] = config["models"][:1]
    config["models"][0].update(admission="static", inflight_cap=streams * 2)
    stack = Stack(config, gateway_port=free_port(), sims={ports[0]: DEMO_MODELS[0]},
                  workers=0, batch_workers=0, env={"FAIRQ_METRICS_PORT": "0"})  # fmt: skip
    body = {"model": DEMO_MODELS[0], "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with stack:
        assert stack.redis_url is not None
        producer = subprocess.Popen([sys.executable, "-m", "benchmarks.streaming.fanout",
                                     "--tokens", str(tokens)], env=stack.env)  # fmt: skip
        try:
            url = f"{stack.gateway_url}/v1/chat/completions"
            asyncio.run(run_load(url, body, KEY, 8, seconds=1.0))  # warm-up
            pids = {"gateway": stack.processes["api"].pid, "producer": producer.pid,
                    "dispatcher": stack.processes["dispatcher-0"].pid,
                    "redis": stack._redis.process.pid if stack._redis and stack._redis.process
                    else 0, "clients": os.getpid()}  # fmt: skip
            redis_url = stack.redis_url

            def watch() -> int:
                return gateway_redis_connections(redis_url, pids["gateway"])

            m = asyncio.run(
                _measure(url, body, streams, seconds=seconds, settle_s=settle_s,
                         stagger_s=stagger_s, pids=pids, watch=watch)
            )  # fmt: skip
            m["split"] = ttft_split(redis_url, DEMO_MODELS[0])
        finally:
            producer.terminate()
            producer.wait(10)
    load, tokens, cpu, seconds = m["load"], m["tokens"], m["cpu_s"], m["seconds"]
    return {
        "streams": streams, "tokens": tokens, "requests": load.requests,
        "failed": load.failed, "tokens_per_s": tokens / seconds,
        "settle_s": settle_s, "stagger_s": stagger_s, "seconds": seconds,
        "cpu_s_per_s": {name: s / seconds for name, s in cpu.items()},
        "target_tokens_per_s": streams * 1000 / STEP_MS,
        "step_ms": STEP_MS, "itl_p50_ms": median(load.gaps_ms),
        "itl_p99_ms": pct(load.gaps_ms, 99),
        "added_itl_p99_ms": pct(load.gaps_ms, 99) - STEP_MS,
        "ttft_p50_ms": median(load.ttft_ms),
        "gateway_cpu_ms_per_1k_tokens": cpu["gateway"] * 1e6 / max(tokens, 1),
        "gateway_redis_connections": m["redis_connections"],
        "ttft_split": m["split"],
    }  # fmt: skip


_CPU_COLUMNS = ("gateway", "redis", "dispatcher", "producer", "clients")


def render(result: dict[str, Any], cores: int) -> str:
    r = result
    rows = [[r["streams"], round(r["tokens_per_s"]), round(r["target_tokens_per_s"]),
             r["itl_p50_ms"], r["itl_p99_ms"], r["added_itl_p99_ms"], r["ttft_p50_ms"],
             *(r["cpu_s_per_s"][k] for k in _CPU_COLUMNS),
             r["gateway_cpu_ms_per_1k_tokens"],
             r["gateway_redis_connections"], r["failed"]]]  # fmt: skip
    header = ["streams", "tokens/s received", "tokens/s sent", "ITL p50 ms", "ITL p99 ms",
              "added ITL p99 ms", "TTFT p50 ms", "gateway CPU s/s", "Redis CPU s/s",
              "dispatcher CPU s/s", "producer CPU s/s", "clients CPU s/s",
              "gateway CPU ms / 1k tok", "gateway Redis conns", "failed"]  # fmt: skip
    return (
        f"{markdown_table(header, rows)}\n\nFan-out: one gateway process; jobs run by a producer "
        f"that writes one token per job every {r['step_ms']:.0f} ms through the worker's "
        f"ResultWriter (no engine); the clients' first requests spread over "
        f"{r.get('stagger_s', 0):.0f} s; figures over {r['seconds']:.0f} s, from "
        f"{r['settle_s']:.0f} s after the start (every stream started); "
        f"added ITL = client ITL p99 - the step; {cores} cores."
        + _render_split(r.get("ttft_split"))
    )


def _render_split(split: dict[str, float] | None) -> str:
    if not split:
        return ""
    return (
        f" Where the first token's wait went (medians over {split['jobs']:.0f} jobs, from "
        f"their own times): enqueued to dispatched {split['queued_p50_ms']:.1f} ms, "
        f"dispatched to started {split['dispatched_to_started_p50_ms']:.1f} ms (the first "
        "token follows within a step); the rest is the gateway's."
    )


@click.command()
@click.option("--tokens", default=100, show_default=True)
@click.option("--step-ms", default=STEP_MS, show_default=True)
def main(tokens: int, step_ms: float) -> None:
    """The producer process (started by ``run``; settings from FAIRQ_* as any worker)."""
    asyncio.run(Producer(load_settings(), tokens, step_ms).run())


if __name__ == "__main__":
    main()
