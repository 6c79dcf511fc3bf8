"""What each of fairq's processes costs while nothing is queued, and the first request after.

``fairq up``'s stack (``fairq.stack.Stack``: two simulated engines, a dispatcher, a worker,
a batch worker, the gateway, a private Redis) is started and left alone for a warm-up, so
that start-up work is over; then each process's CPU (user + system, its own counters) is
read over ``--seconds``. Reported in % of one core. fairq's components (dispatcher, worker,
batch worker, gateway) must each stay under ``BUDGET_PCT``; the run fails otherwise. The
engines and Redis are listed for scale: the engines' part is what answering fairq's scrapes
costs them.

After the idle window one streamed request goes through the gateway: its time to first
token, against three requests right after it, shows whether an idle system makes the first
request wait (for a scrape, a connection, a slow poll).

    python -m benchmarks.scale.idle                 # 60 s
    python -m benchmarks.scale.idle --seconds 20
"""

from __future__ import annotations

import time
from typing import Any

import click
import httpx
import psutil

from benchmarks.lib.stats import cpu_seconds, machine, markdown_table, median, save
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config

BUDGET_PCT = 1.0  # of one core, per fairq component
WARMUP_S = 10.0
FAIRQ = ("dispatcher-0", "worker-0", "batch-worker-0", "api")
_QUIET = {"FAIRQ_LOG_LEVEL": "WARNING"}


def _pids(stack: Stack) -> dict[str, int]:
    """Every process of the stack by name, the private Redis (a child of this one) too."""
    pids = {name: process.pid for name, process in stack.processes.items()}
    for child in psutil.Process().children():
        if any("valkey" in part or "redis" in part for part in child.cmdline()[:1]):
            pids["redis"] = child.pid
    return pids


def first_token_ms(url: str) -> float:
    """One streamed chat request through the gateway: ms from send to its first content."""
    body = {
        "model": DEMO_MODELS[0],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    headers = {"Authorization": "Bearer fq-demo-alice"}
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                first = (time.perf_counter() - started) * 1000
                break
        else:
            raise click.ClickException("the request after idle streamed no output")
        for _ in lines:
            pass
    return first


def run(seconds: float, warmup_s: float = WARMUP_S) -> dict[str, Any]:
    ports = [free_port() for _ in DEMO_MODELS]
    sims = dict(zip(ports, DEMO_MODELS, strict=True))
    stack = Stack(demo_config(ports), gateway_port=free_port(), sims=sims, env=dict(_QUIET))
    with stack:
        pids = _pids(stack)
        time.sleep(warmup_s)
        before, wall = cpu_seconds(pids), time.monotonic()
        time.sleep(seconds)
        after, wall = cpu_seconds(pids), time.monotonic() - wall
        first = first_token_ms(stack.gateway_url)
        warm = [first_token_ms(stack.gateway_url) for _ in range(3)]
    return {
        "seconds": wall,
        "warmup_s": warmup_s,
        "cpu_pct": {name: (after[name] - before[name]) * 100 / wall for name in pids},
        "first_after_idle_ms": first,
        "warm_ms": warm,
    }


def render(result: dict[str, Any]) -> str:
    rows = []
    for name, pct in sorted(result["cpu_pct"].items(), key=lambda kv: (kv[0] not in FAIRQ, kv[0])):
        budget = f"< {BUDGET_PCT:g}" if name in FAIRQ else "(not fairq's)"
        rows.append([name, f"{pct:.2f}", budget])
    table = markdown_table(["process", "CPU, % of a core", "budget"], rows)
    warm = median(result["warm_ms"])
    return (
        f"{table}\n\nIdle for {result['seconds']:.0f} s after a {result['warmup_s']:g} s warm-up. "
        f"The first request after idle: first token in {result['first_after_idle_ms']:.1f} ms "
        f"(the next three: median {warm:.1f} ms)."
    )


@click.command()
@click.option("--seconds", default=60.0, show_default=True, help="idle time measured")
@click.option("--warmup", default=WARMUP_S, show_default=True, help="seconds before it")
@click.option("--out", default="bench-out", show_default=True)
def main(seconds: float, warmup: float, out: str) -> None:
    """The CPU of each process of an idle stack; fails above the budget."""
    result = run(seconds, warmup)
    text = render(result)
    save(out, "idle", {"machine": machine(), **result}, text)
    click.echo(text)
    over = [n for n in FAIRQ if result["cpu_pct"].get(n, 0.0) >= BUDGET_PCT]
    if over:
        raise click.ClickException(f"over {BUDGET_PCT:g}% of a core while idle: {over}")


if __name__ == "__main__":
    main()
