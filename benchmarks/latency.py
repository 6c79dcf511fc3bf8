"""Added latency of the fairq path on an idle system, against calling the engine directly.

One streamed chat completion at a time, alternating between the two arms so
both see the same machine noise: (direct) the simulator itself, (fairq) the
gateway → Redis → dispatcher → worker → simulator path. Reports time to first
token (first content chunk) and inter-token delay (gaps between content chunks
as the client receives them), p50 and p99, the differences, and the CPU the
worker and gateway spent per 1,000 streamed tokens.

The simulator's timings are estimates of an engine, not a GPU's. Run with
``python -m benchmarks.latency`` (``make bench``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import click
import httpx
import orjson
import psutil

from benchmarks.stats import machine, markdown_table, median, pct, save
from fairq.localredis import free_port
from fairq.stack import DEMO_MODELS, Stack, demo_config

KEY = "fq-demo-alice"


@dataclass
class Arm:
    name: str
    url: str
    headers: dict[str, str]
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    tokens: int = 0


def one_request(client: httpx.Client, arm: Arm, tokens: int) -> None:
    body = {"model": DEMO_MODELS[0], "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "Say something."}]}  # fmt: skip
    start = time.perf_counter()
    last: float | None = None
    with client.stream("POST", arm.url, json=body, headers=arm.headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if not chunk.get("choices") or not chunk["choices"][0]["delta"].get("content"):
                continue
            now = time.perf_counter()
            if last is None:
                arm.ttft_ms.append((now - start) * 1000)
            else:
                arm.gaps_ms.append((now - last) * 1000)
            last = now
            arm.tokens += 1


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def run(requests: int, tokens: int) -> dict[str, object]:
    sim_ports = [free_port(), free_port()]
    stack = Stack(demo_config(sim_ports), gateway_port=free_port(),
                  sims=dict(zip(sim_ports, DEMO_MODELS, strict=True)))  # fmt: skip
    with stack, httpx.Client(timeout=30) as client:
        direct = Arm("direct", f"http://127.0.0.1:{sim_ports[0]}/v1/chat/completions", {})
        fairq = Arm("fairq", f"{stack.gateway_url}/v1/chat/completions",
                    {"Authorization": f"Bearer {KEY}"})  # fmt: skip
        for arm in (direct, fairq):  # warm-up: connections, script cache, JIT-free but lazy paths
            for _ in range(5):
                one_request(client, Arm(arm.name, arm.url, arm.headers), tokens)
        fairq_pids = [p.pid for n, p in stack.processes.items() if n in ("api", "worker-0")]
        cpu_before = cpu_s(fairq_pids)
        for _ in range(requests):
            one_request(client, direct, tokens)
            one_request(client, fairq, tokens)
        cpu_fairq = cpu_s(fairq_pids) - cpu_before
    return report(direct, fairq, cpu_fairq, requests, tokens)


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
        f"worker+gateway CPU {result['fairq_cpu_ms_per_1000_tokens']:.0f} ms per 1,000 tokens. "
        f"{result['note']}."
    )


@click.command()
@click.option("--requests", default=500, show_default=True, help="requests per arm")
@click.option("--tokens", default=16, show_default=True, help="output tokens per request")
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(requests: int, tokens: int, out: str) -> None:
    result = run(requests, tokens)
    text = render(result)
    save(out, "latency", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
