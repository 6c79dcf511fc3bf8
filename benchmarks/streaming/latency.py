"""Added latency of the fairq path on an idle system, against calling the engine directly.

One streamed chat completion at a time, alternating between the two arms so
both see the same machine noise: (direct) the simulator itself, (fairq) the
gateway → Redis → dispatcher → worker → simulator path. Reports time to first
token (first content chunk) and inter-token delay (gaps between content chunks
as the client receives them), p50 and p99, the differences, and the CPU the
worker and gateway spent per 1,000 streamed tokens.

With ``--load 0.5`` the same probes run while a background load keeps the engine at
half its capacity: first the engine's capacity is measured in the same run (the
simulator saturated directly with twice as many streams as it batches, each sent again
as it ends: requests completed per second, ``latency_load.capacity``), then another
user sends Poisson arrivals of the same shape at ``load`` x that rate through fairq (as
all traffic would go in production), from a process of its own, while the probes run.
The engine's running and waiting requests are sampled from its /metrics during the
probes to show the load it saw.

The simulator's timings are estimates of an engine, not a GPU's. Run with
``python -m benchmarks.streaming.latency`` (``make bench``).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import click
import httpx
import orjson
import redis

from benchmarks.lib.stats import cpu_seconds, machine, markdown_table, median, pct, save
from benchmarks.streaming.latency_load import Target, capacity
from broker import keys
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config
from gateway.errors import JOB_HEADER

KEY = "fq-demo-alice"
BACKGROUND_KEY = "fq-demo-bob"  # the background load is another user's


@dataclass
class Arm:
    name: str
    url: str
    headers: dict[str, str]
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    probes: list[Probe] = field(default_factory=list)  # fairq's arm: what to trace


@dataclass(frozen=True)
class Probe:
    """One fairq probe: its job id and client-side times (epoch ms) to split it by."""

    job_id: str
    sent_ms: float
    ttft_ms: float


def one_request(client: httpx.Client, arm: Arm, tokens: int) -> None:
    body = {"model": DEMO_MODELS[0], "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "Say something."}]}  # fmt: skip
    sent_ms = time.time() * 1000
    start = time.perf_counter()
    last: float | None = None
    with client.stream("POST", arm.url, json=body, headers=arm.headers) as response:
        response.raise_for_status()
        job_id = response.headers.get(JOB_HEADER)
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if not chunk.get("choices") or not chunk["choices"][0]["delta"].get("content"):
                continue
            now = time.perf_counter()
            if last is None:
                arm.ttft_ms.append((now - start) * 1000)
                if job_id is not None:
                    arm.probes.append(Probe(job_id, sent_ms, arm.ttft_ms[-1]))
            else:
                arm.gaps_ms.append((now - last) * 1000)
            last = now
            arm.tokens += 1


@dataclass
class Load:
    """The background load of a run under load, and what the engine showed meanwhile."""

    fraction: float
    tokens: int
    capacity_rps: float = 0.0
    background: dict[str, object] = field(default_factory=dict)
    running: list[float] = field(default_factory=list)  # engine samples during the probes
    waiting: list[float] = field(default_factory=list)

    def public(self) -> dict[str, object]:
        return {
            "fraction_of_capacity": self.fraction, "tokens_per_request": self.tokens,
            "capacity_rps": self.capacity_rps, "target_rps": self.fraction * self.capacity_rps,
            "background": self.background, "engine_running_mean": _mean(self.running),
            "engine_waiting_mean": _mean(self.waiting),
        }  # fmt: skip


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def sample_engine(client: httpx.Client, sim_url: str, load: Load) -> None:
    """One reading of the engine's running and waiting requests (its own /metrics)."""
    for line in client.get(f"{sim_url}/metrics").text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            load.running.append(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("vllm:num_requests_waiting"):
            load.waiting.append(float(line.rsplit(" ", 1)[1]))


@contextmanager
def background(stack: Stack, load: Load, sim_url: str) -> Iterator[None]:
    """Measure the engine's capacity, then keep ``load.fraction`` of it coming through
    fairq from another process for the duration of the block."""
    direct = Target(f"{sim_url}/v1/chat/completions", DEMO_MODELS[0], load.tokens)
    load.capacity_rps = asyncio.run(capacity(direct, streams=64, seconds=10))
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.streaming.latency_load", "--url",
         f"{stack.gateway_url}/v1/chat/completions", "--model", DEMO_MODELS[0],
         "--tokens", str(load.tokens), "--rate", str(load.fraction * load.capacity_rps),
         "--key", BACKGROUND_KEY],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(3)  # the engine reaches its steady running set
        yield
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
        load.background = orjson.loads(out) if out.strip() else {"error": "no report"}


def run(requests: int, tokens: int, load: Load | None = None) -> dict[str, object]:
    sim_ports = [free_port(), free_port()]
    stack = Stack(demo_config(sim_ports), gateway_port=free_port(),
                  sims=dict(zip(sim_ports, DEMO_MODELS, strict=True)))  # fmt: skip
    sim_url = f"http://127.0.0.1:{sim_ports[0]}"
    with stack, httpx.Client(timeout=30) as client:
        direct = Arm("direct", f"{sim_url}/v1/chat/completions", {})
        fairq = Arm("fairq", f"{stack.gateway_url}/v1/chat/completions",
                    {"Authorization": f"Bearer {KEY}"})  # fmt: skip
        for arm in (direct, fairq):  # warm-up: connections, script cache, JIT-free but lazy paths
            for _ in range(5):
                one_request(client, Arm(arm.name, arm.url, arm.headers), tokens)
        fairq_pids = {n: p.pid for n, p in stack.processes.items() if n in ("api", "worker-0")}
        with background(stack, load, sim_url) if load else _nothing():
            cpu_before = sum(cpu_seconds(fairq_pids).values())
            for i in range(requests):
                one_request(client, direct, tokens)
                one_request(client, fairq, tokens)
                if load and i % 10 == 0:
                    sample_engine(client, sim_url, load)
            cpu_fairq = sum(cpu_seconds(fairq_pids).values()) - cpu_before
        traced = trace(stack.redis_url, fairq.probes) if stack.redis_url else None
    result = report(direct, fairq, cpu_fairq, requests, tokens)
    if traced is not None:
        result["trace"] = traced
    if load:
        result["load"] = load.public()
    return result


_PARTS = ("gateway", "queued", "pickup", "engine", "delivery")


def trace(redis_url: str, probes: list[Probe], slowest: float = 95) -> dict[str, object]:
    """Split the fairq probes' TTFT by the times their job hashes keep (ms): client send ->
    enqueued ``tq`` (gateway), -> dispatched ``td`` (queued), -> started by a worker
    ``tr`` (pickup), -> first token ``tf`` (engine), -> the client's first token
    (delivery). The probes at or above the ``slowest`` percentile one by one, all by
    median; ``express`` says the job was never queued (no queue entry 'qe')."""
    client = redis.Redis.from_url(redis_url)
    fields = ("qe", "tq", "td", "tr", "tf")
    with client.pipeline(transaction=False) as pipe:
        for p in probes:
            pipe.hmget(keys.job(DEMO_MODELS[0], p.job_id), *fields)
        rows = pipe.execute()
    client.close()
    split: list[dict[str, Any]] = []
    for p, (qe, *times) in zip(probes, rows, strict=True):
        if not all(times):
            continue
        tq, td, tr, tf = (int(t) for t in times)
        marks = (p.sent_ms, tq, td, tr, tf, p.sent_ms + p.ttft_ms)
        parts = {n: marks[i + 1] - marks[i] for i, n in enumerate(_PARTS)}
        split.append({"job": p.job_id, "ttft_ms": p.ttft_ms, "express": qe is None, **parts})
    cut = pct([s["ttft_ms"] for s in split], slowest)
    slow = sorted((s for s in split if s["ttft_ms"] >= cut), key=lambda s: s["ttft_ms"])
    medians = {n: median([s[n] for s in split]) for n in _PARTS}
    return {"traced": len(split), "express_share": _share(split), "median": medians,
            "slowest_percentile": slowest, "slowest": slow,
            "slowest_express_share": _share(slow)}  # fmt: skip


def _share(split: list[dict[str, object]]) -> float:
    return sum(1 for s in split if s["express"]) / len(split) if split else float("nan")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def summary(arm: Arm) -> dict[str, float]:
    return {
        "ttft_p50_ms": median(arm.ttft_ms),
        "ttft_p99_ms": pct(arm.ttft_ms, 99),
        "itl_p50_ms": median(arm.gaps_ms),
        "itl_p99_ms": pct(arm.gaps_ms, 99),
    }


def report(
    direct: Arm, fairq: Arm, cpu_fairq: float, requests: int, tokens: int
) -> dict[str, object]:
    d, f = summary(direct), summary(fairq)
    added = {k: f[k] - d[k] for k in d}
    return {
        "benchmark": "latency",
        "machine": machine(),
        "requests_per_arm": requests,
        "tokens_per_request": tokens,
        "direct": d,
        "fairq": f,
        "added": added,
        "fairq_cpu_ms_per_1000_tokens": cpu_fairq * 1000 / max(fairq.tokens, 1) * 1000,
        "note": "engine = fairq's simulator; its timings are estimates, not a GPU's",
    }


def render(result: dict[str, object]) -> str:
    d, f, a = result["direct"], result["fairq"], result["added"]
    assert isinstance(d, dict) and isinstance(f, dict) and isinstance(a, dict)
    columns = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
    arms = (("direct (simulator)", d), ("fairq", f), ("added by fairq", a))
    rows = [[name, *(values[k] for k in columns)] for name, values in arms]
    table = markdown_table(["arm", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"], rows)
    m = result["machine"]
    assert isinstance(m, dict)
    return (
        f"{table}\n\n{result['requests_per_arm']} requests per arm, "
        f"{result['tokens_per_request']} tokens each, one at a time, {m['cores']} cores; "
        f"{_render_cpu(result)}{result['note']}.{_render_load(result.get('load'))}"
        f"{_render_trace(result.get('trace'))}"
    )


def _render_trace(traced: object) -> str:
    if not isinstance(traced, dict) or not traced["slowest"]:
        return ""
    header = ["job", "TTFT ms", "express", *(f"{n} ms" for n in _PARTS)]
    rows = [[s["job"], s["ttft_ms"], s["express"], *(s[n] for n in _PARTS)]
            for s in traced["slowest"]]  # fmt: skip
    rows.append(["median of all", "", f"{traced['express_share']:.0%}",
                 *(traced["median"][n] for n in _PARTS)])  # fmt: skip
    return (
        f"\n\nfairq probes at or above their p{traced['slowest_percentile']:g} TTFT, split by "
        "the job's own times (gateway: sent -> enqueued; queued: -> dispatched; pickup: -> "
        "a worker started it; engine: -> first token written; delivery: -> the client's "
        f"first token):\n\n{markdown_table(header, rows)}"
    )


def _render_cpu(result: dict[str, object]) -> str:
    if "load" in result:  # the background's work is in the processes' counters too
        return ""
    return f"worker+gateway CPU {result['fairq_cpu_ms_per_1000_tokens']:.0f} ms per 1,000 tokens. "


def _render_load(load: object) -> str:
    if not isinstance(load, dict):
        return ""
    bg = load["background"]
    return (
        f"\n\nUnder load: engine capacity {load['capacity_rps']:.1f} requests/s "
        f"({load['tokens_per_request']}-token streamed requests, measured first, saturated "
        f"directly); background through fairq at {load['fraction_of_capacity']:.0%} of it: "
        f"target {load['target_rps']:.1f}/s, sent {bg.get('rate_per_s', float('nan')):.1f}/s, "
        f"{bg.get('ended_ok')} ended well, {bg.get('failed')} failed; engine running "
        f"{load['engine_running_mean']:.1f} requests on average (of its batch of 32), "
        f"waiting {load['engine_waiting_mean']:.1f}."
    )


@click.command()
@click.option("--requests", default=500, show_default=True, help="requests per arm")
@click.option("--tokens", default=16, show_default=True, help="output tokens per request")
@click.option(
    "--load",
    "fraction",
    default=0.0,
    show_default=True,
    help="background load as a fraction of the engine's measured capacity (0: idle)",
)
@click.option(
    "--load-tokens", default=64, show_default=True, help="output tokens per background request"
)
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(requests: int, tokens: int, fraction: float, load_tokens: int, out: str) -> None:
    load = Load(fraction, load_tokens) if fraction > 0 else None
    result = run(requests, tokens, load)
    text = render(result)
    save(out, "latency_load" if load else "latency", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
