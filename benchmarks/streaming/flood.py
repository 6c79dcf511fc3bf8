"""The flood: tens of thousands of requests through the official openai client against two
gateways, counting every client error (issue 21: 11 ``ReadError``s in 45,000 before).

Each of ``--users`` users is an ``AsyncOpenAI`` client of its own (its own connection
pool, the SDK's defaults but no retries, so that every failure counts) on one of two
gateways, sending chat completions (streamed or not, over the demo models) one after
the other. After a share of them (``--pause-share``) it pauses for 4 to 6 s: its pooled
connection then sits idle around the 5 s at which httpx and the SDK drop it, where a
server that closes idle connections at 5 s races the client's next request. The
stack: two gateways, two dispatchers, two workers and two simulated engines that
answer at once (``INSTANT``), one Redis, all on this machine.

Counted: answers by status, client errors by exception (and its cause), the gateways'
logged errors, latency, rate, and the machine's load while it ran. 429s are documented
(``max_queued_per_user``); nothing else may fail.

Run with ``python -m benchmarks.streaming.flood`` (not part of ``make test``: minutes of load).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import click
import openai
import yaml

from benchmarks.lib.stats import machine, markdown_table, pct, save
from broker import hash_key
from fairq.stack.answering import wait_answering
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config

INSTANT = {"step_base_ms": 0.2, "step_per_seq_ms": 0.0, "prefill_ms_per_token": 0.0,
           "max_num_seqs": 256, "max_num_batched_tokens": 8192}  # fmt: skip
TOKENS = 8
KEYS = [f"fq-flood-{i}" for i in range(16)]  # users share keys: 16 fairness units
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


class Tally:
    def __init__(self) -> None:
        self.sent = 0
        self.statuses: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.loads: list[float] = []


async def _one(client: openai.AsyncOpenAI, stream: bool, tally: Tally) -> None:
    model = random.choice(DEMO_MODELS)
    start = time.perf_counter()
    try:
        if stream:
            chunks = await client.chat.completions.create(
                model=model, messages=MESSAGES, max_tokens=TOKENS, stream=True
            )
            async for _ in chunks:
                pass
        else:
            await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=TOKENS)
        tally.statuses["200"] += 1
        tally.latencies.append(time.perf_counter() - start)
    except openai.APIStatusError as exc:
        tally.statuses[str(exc.status_code)] += 1
        if exc.status_code != 429:
            tally.errors[f"{exc.status_code} {exc.code}"] += 1
    except openai.APIError as exc:  # no answer: connection reset, read error, timeout
        cause = exc.__cause__
        tally.errors[f"{type(exc).__name__} ({type(cause).__name__ if cause else '-'})"] += 1


async def _user(url: str, key: str, total: int, options: dict[str, float], tally: Tally) -> None:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0) as client:
        while tally.sent < total:
            tally.sent += 1
            await _one(client, random.random() < options["stream_share"], tally)
            if random.random() < options["pause_share"]:
                await asyncio.sleep(random.uniform(4.0, 6.0))


async def _loads(tally: Tally, stop: asyncio.Event) -> None:
    while not stop.is_set():
        tally.loads.append(os.getloadavg()[0])
        await asyncio.sleep(5)


async def _flood(urls: list[str], total: int, users: int, options: dict[str, float]) -> Tally:
    tally = Tally()
    stop = asyncio.Event()
    sampler = asyncio.create_task(_loads(tally, stop))
    await asyncio.gather(
        *(_user(urls[i % len(urls)], KEYS[i % len(KEYS)], total, options, tally)
          for i in range(users))
    )  # fmt: skip
    stop.set()
    await sampler
    return tally


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    if not wait_answering(f"{url}/readyz", timeout_s, alive=lambda: process.poll() is None):
        raise RuntimeError(f"the second gateway at {url} did not become ready")


def _logged_errors(log_dir: Path) -> dict[str, int]:
    """Lines of each gateway's log that report an error or a traceback."""
    counts = {}
    for log in sorted(log_dir.glob("api*.log")):
        lines = log.read_text(errors="replace").splitlines()
        counts[log.stem] = sum("ERROR" in ln or "Traceback" in ln for ln in lines)
    return counts


def run(total: int, users: int, options: dict[str, float]) -> dict[str, Any]:
    ports = [free_port(), free_port()]
    keys = [{"sha256": hash_key(k), "user": f"flood-{i}"} for i, k in enumerate(KEYS)]
    config = demo_config(ports, api_keys=keys)
    for model in config["models"]:
        model.update(admission="static", inflight_cap=users)
    with tempfile.TemporaryDirectory() as tmp:
        profile, logs = Path(tmp, "instant.yaml"), Path(tmp, "logs")
        profile.write_text(yaml.safe_dump(INSTANT))
        logs.mkdir()
        sims = dict(zip(ports, DEMO_MODELS, strict=True))
        stack = Stack(config, gateway_port=free_port(), sims=sims,
                      sim_profiles=dict.fromkeys(ports, str(profile)), workers=2, dispatchers=2,
                      batch_workers=0, log_dir=logs, env={"FAIRQ_METRICS_PORT": "0"})  # fmt: skip
        with stack:
            second = free_port()
            with (logs / "api-2.log").open("ab") as log:
                gateway = subprocess.Popen(
                    [sys.executable, "-m", "fairq", "api", "--host", "127.0.0.1",
                     "--port", str(second)], env=stack.env, stdout=log, stderr=log,
                )  # fmt: skip
            try:
                urls = [stack.gateway_url, f"http://127.0.0.1:{second}"]
                _wait_ready(urls[1], gateway)
                start = time.perf_counter()
                tally = asyncio.run(_flood(urls, total, users, options))
                seconds = time.perf_counter() - start
            finally:
                gateway.terminate()
                gateway.wait(15)
        logged = _logged_errors(logs)
    return {
        "benchmark": "flood", "machine": machine(), "requests": tally.sent,
        "users": users, "options": options, "seconds": seconds,
        "requests_per_s": tally.sent / seconds, "statuses": dict(tally.statuses),
        "client_errors": dict(tally.errors), "gateway_logged_errors": logged,
        "latency_s": {"p50": pct(tally.latencies, 50), "p99": pct(tally.latencies, 99)},
        "load_1m": {"mean": sum(tally.loads) / max(len(tally.loads), 1),
                    "max": max(tally.loads, default=0.0)},
        "note": "engines = fairq's simulator answering at once; everything on this machine",
    }  # fmt: skip


def render(result: dict[str, Any]) -> str:
    rows = [[status, n] for status, n in sorted(result["statuses"].items())]
    rows += [[f"client error: {kind}", n] for kind, n in sorted(result["client_errors"].items())]
    table = markdown_table(["outcome", "requests"], rows)
    load = result["load_1m"]
    return (
        f"{table}\n\n{result['requests']} requests from {result['users']} openai clients "
        f"over 2 gateways in {result['seconds']:.0f} s ({result['requests_per_s']:.0f}/s); "
        f"latency p50 {result['latency_s']['p50'] * 1e3:.0f} ms, p99 "
        f"{result['latency_s']['p99'] * 1e3:.0f} ms; errors logged by the gateways: "
        f"{result['gateway_logged_errors']}; 1-minute load {load['mean']:.1f} mean, "
        f"{load['max']:.1f} max on {result['machine']['cores']} cores. {result['note']}."
    )


@click.command()
@click.option("--requests", "total", default=45_000, show_default=True)
@click.option("--users", default=256, show_default=True, help="openai clients, one each")
@click.option("--pause-share", default=0.2, show_default=True,
              help="share of requests after which the user pauses 4-6 s")  # fmt: skip
@click.option("--stream-share", default=0.5, show_default=True)
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(total: int, users: int, pause_share: float, stream_share: float, out: str) -> None:
    options = {"pause_share": pause_share, "stream_share": stream_share}
    result = run(total, users, options)
    text = render(result)
    save(out, "flood", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
