"""End-to-end job rate: fairq (Python client and HTTP gateway) against plain RQ jobs.

Every arm does the same work: a non-streamed chat completion of a few tokens
against a simulator that answers almost at once, so the machinery around the
engine is what is measured. Arms, one after the other in one run, on the same
machine:

* ``fairq client``: ``broker.AsyncClient`` submits and awaits the results
  (enqueue -> dispatch -> worker -> result stream), ``--concurrency`` at a time;
* ``fairq gateway``: the same through the OpenAI HTTP API (httpx clients);
* ``rq``: one plain RQ job per request (``benchmarks.scale.rq_job.complete`` posts
  the request to the simulator with httpx), one ``rq worker`` per core.

The fairq arms alternate for ``--rounds`` rounds and each reports its median;
RQ, twenty times slower, runs once. The load generator is this process, on
the same cores, so its own CPU per job is reported beside each arm. The gateway
arm spreads its requests over several httpx clients of ``CONNECTIONS_PER_CLIENT``
connections each: one httpx client with 128 connections spent 11 ms of CPU per
request here (its connection pool's bookkeeping grows with the connections), so
it, not the gateway, set the rate (about 85 jobs/s against about 800).

fairq runs one gateway, one dispatcher and one worker. Its admission is the
static in-flight cap (the engine admits freely here); the metric-driven
admission is measured by ``fairq bench fairness``.

Run with ``python -m benchmarks.scale.jobrate``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click
import httpx
import redis
import yaml
from rq import Queue

from benchmarks.lib.stats import machine, markdown_table, median, save
from benchmarks.scale.rq_job import complete
from broker import AsyncClient, Settings
from fairq.stack.localredis import LocalRedis, free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config

KEY = "fq-demo-alice"
TOKENS = 4
INSTANT = {"step_base_ms": 0.2, "step_per_seq_ms": 0.0, "prefill_ms_per_token": 0.0,
           "max_num_seqs": 256, "max_num_batched_tokens": 8192}  # fmt: skip
MESSAGES = [{"role": "user", "content": "hi"}]
CONNECTIONS_PER_CLIENT = 4


async def _bounded(jobs: int, concurrency: int, one: Any) -> float:
    """Run ``one(i)`` for every job, ``concurrency`` at a time; returns the seconds taken."""
    gate = asyncio.Semaphore(concurrency)

    async def guarded(i: int) -> None:
        async with gate:
            await one(i)

    start = time.perf_counter()
    await asyncio.gather(*(guarded(i) for i in range(jobs)))
    return time.perf_counter() - start


async def client_arm(settings: Settings, jobs: int, concurrency: int) -> float:
    async with AsyncClient(settings, api_key=KEY) as client:

        async def one(_: int) -> None:
            job_id = await client.submit(DEMO_MODELS[0], messages=MESSAGES, max_tokens=TOKENS)
            body = await client.result(job_id)
            assert body["usage"]["completion_tokens"] == TOKENS

        return await _bounded(jobs, concurrency, one)


async def gateway_arm(url: str, jobs: int, concurrency: int) -> float:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": DEMO_MODELS[0], "messages": MESSAGES, "max_tokens": TOKENS}
    limits = httpx.Limits(max_connections=CONNECTIONS_PER_CLIENT)
    clients = [httpx.AsyncClient(limits=limits, timeout=60, headers=headers)
               for _ in range(max(concurrency // CONNECTIONS_PER_CLIENT, 1))]  # fmt: skip
    try:

        async def one(i: int) -> None:
            response = await clients[i % len(clients)].post(f"{url}/v1/chat/completions", json=body)
            response.raise_for_status()

        return await _bounded(jobs, concurrency, one)
    finally:
        for client in clients:
            await client.aclose()


def _timed(arm: Callable[[], Coroutine[Any, Any, float]], jobs: int) -> dict[str, float]:
    """One run of an arm: its rate and the load generator's (this process's) CPU per job."""
    cpu = time.process_time()
    seconds = asyncio.run(arm())
    return {
        "jobs_per_s": jobs / seconds,
        "load_cpu_ms_per_job": (time.process_time() - cpu) * 1e3 / jobs,
    }


def rq_arm(sim_url: str, jobs: int) -> float:
    with LocalRedis() as server:
        r = redis.Redis.from_url(server.url)
        queue = Queue("bench", connection=r)
        command = [sys.executable, "-m", "rq.cli", "worker", "--url", server.url]
        command += ["--quiet", "--burst", "bench"]
        workers = [
            subprocess.Popen(command, stdout=subprocess.DEVNULL) for _ in range(os.cpu_count() or 1)
        ]
        body = {"model": DEMO_MODELS[0], "messages": MESSAGES, "max_tokens": TOKENS}
        start = time.perf_counter()
        handles = [queue.enqueue(complete, f"{sim_url}/v1/chat/completions", body)
                   for _ in range(jobs)]  # fmt: skip
        for worker in workers:  # burst workers leave once the queue is empty
            worker.wait(timeout=600)
        elapsed = time.perf_counter() - start
        finished = sum(job.get_status(refresh=True) == "finished" for job in handles)
        r.close()
    if finished != jobs:
        raise RuntimeError(f"RQ finished {finished} of {jobs} jobs")
    return elapsed


def run(jobs: int, rq_jobs: int, concurrency: int, rounds: int) -> dict[str, Any]:
    ports = [free_port(), free_port()]
    config = demo_config(ports)
    for model in config["models"]:
        model.update(admission="static", inflight_cap=concurrency)
    runs: dict[str, list[dict[str, float]]] = {"fairq client": [], "fairq gateway": []}
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp, "instant.yaml")
        profile.write_text(yaml.safe_dump(INSTANT))
        sims = dict(zip(ports, DEMO_MODELS, strict=True))
        stack = Stack(config, gateway_port=free_port(), sims=sims,
                      sim_profiles=dict.fromkeys(ports, str(profile)))  # fmt: skip
        with stack:
            settings = Settings(redis_url=stack.redis_url, **config)  # type: ignore[arg-type]
            asyncio.run(client_arm(settings, 50, concurrency))  # warm-up
            arms = {
                "fairq client": lambda: client_arm(settings, jobs, concurrency),
                "fairq gateway": lambda: gateway_arm(stack.gateway_url, jobs, concurrency),
            }
            for i in range(rounds):
                for name in list(arms)[:: 1 if i % 2 == 0 else -1]:  # alternate who goes first
                    runs[name].append(_timed(arms[name], jobs))
            rq_s = rq_arm(f"http://127.0.0.1:{ports[0]}", rq_jobs)
    rates = {name: median([r["jobs_per_s"] for r in rs]) for name, rs in runs.items()}
    rates["rq"] = rq_jobs / rq_s
    return {
        "benchmark": "jobrate", "machine": machine(), "jobs": jobs, "rq_jobs": rq_jobs,
        "concurrency": concurrency, "rounds": rounds, "jobs_per_s": rates,
        "vs_rq": {k: v / rates["rq"] for k, v in rates.items() if k != "rq"},
        "runs": runs,
        "load_cpu_ms_per_job": {
            name: median([r["load_cpu_ms_per_job"] for r in rs])
            for name, rs in runs.items()
        },
        "note": "engine = fairq's simulator answering at once; its timings are estimates",
    }  # fmt: skip


def render(result: dict[str, Any]) -> str:
    load = result["load_cpu_ms_per_job"]
    rows = [[arm, round(rate), f"{result['vs_rq'].get(arm, 1.0):.1f}x",
             f"{load[arm]:.2f}" if arm in load else "-",
             ", ".join(f"{r['jobs_per_s']:.0f}" for r in result["runs"].get(arm, []))]
            for arm, rate in result["jobs_per_s"].items()]  # fmt: skip
    headers = ["arm", "jobs/s (median)", "vs RQ", "load generator CPU ms/job", "each round"]
    table = markdown_table(headers, rows)
    return (
        f"{table}\n\n{result['jobs']} jobs per fairq arm per round, {result['rounds']} rounds "
        f"({result['concurrency']} at a time), "
        f"{result['rq_jobs']} RQ jobs on {result['machine']['cores']} RQ workers, "
        f"{result['machine']['cores']} cores. {result['note']}."
    )


@click.command()
@click.option("--jobs", default=3000, show_default=True, help="jobs per fairq arm")
@click.option("--rq-jobs", default=600, show_default=True, help="jobs of the RQ arm")
@click.option("--concurrency", default=128, show_default=True)
@click.option("--rounds", default=3, show_default=True, help="rounds of the fairq arms")
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(jobs: int, rq_jobs: int, concurrency: int, rounds: int, out: str) -> None:
    result = run(jobs, rq_jobs, concurrency, rounds)
    text = render(result)
    save(out, "jobrate", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
