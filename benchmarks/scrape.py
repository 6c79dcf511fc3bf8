"""The dispatcher's cost of reading engines' ``/metrics``, per endpoint, at fleet scale.

One dispatcher's scraper (``dispatcher.scraper.Scraper``, its real loop and HTTP client)
reads N endpoints at the default interval. Every endpoint serves a real vLLM 0.32
``/metrics`` page (``tests/fixtures/vllm-0.32-cpu/metrics_load.txt``, 634 lines) from a
server in a process of its own. Two arms, side by side, in alternating order per round:

    filtered   today's parser: only the sample lines admission reads reach
               prometheus-client's parser (``dispatcher.engine_metrics.wanted_lines``)
    full       every line through prometheus-client's parser (the parser before)

Reported per arm and N: the scraper process's CPU per endpoint per second (ms), the
cores it takes in all, and the scrape latency (request sent to sample parsed) p50 and
p99. A scrape that failed is counted and fails the run: its figures would be a cheaper
failure, not a cheaper read.

    python -m benchmarks.scrape                      # N = 1, 50, 200
    python -m benchmarks.scrape --endpoints 1,10 --seconds 5 --rounds 1
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx

from benchmarks.stats import machine, markdown_table, median, pct, save
from fairq.localredis import free_port

ARMS = ("filtered", "full")
FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/vllm-0.32-cpu/metrics_load.txt"
MODEL_NAME = "tiny"  # the fixture's model_name label
INTERVAL_S = 0.2  # the default scrape_interval_s
WARMUP_S = 2.0


def serve(port: int) -> None:
    """The engines: ``/e<i>/metrics`` answers the fixture page for any i (blocking)."""
    import uvicorn

    page = FIXTURE.read_bytes()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"text/plain; version=0.0.4")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": page})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def scrape_for(arm: str, endpoints: int, port: int, seconds: float) -> dict[str, Any]:
    """Run the scraper over ``endpoints`` endpoints; its CPU and latencies after warm-up."""
    from dispatcher import engine_metrics
    from dispatcher.scraper import Scraper

    if arm == "full":
        engine_metrics.wanted_lines = lambda text: text
    urls = [f"http://127.0.0.1:{port}/e{i}" for i in range(endpoints)]
    latencies: list[float] = []
    failures: list[str] = []

    class Timed(Scraper):
        async def _fetch(self, endpoint: str) -> Any:
            started = time.perf_counter()
            sample = await super()._fetch(endpoint)
            latencies.append((time.perf_counter() - started) * 1000)
            return sample

        def _record_failure(self, endpoint: str, reason: str) -> None:
            failures.append(reason)
            super()._record_failure(endpoint, reason)

    limits = httpx.Limits(max_connections=endpoints, max_keepalive_connections=endpoints)
    async with httpx.AsyncClient(limits=limits) as http:
        scraper = Timed(
            urls, http, interval_s=INTERVAL_S, model_names=dict.fromkeys(urls, MODEL_NAME)
        )
        task = asyncio.create_task(scraper.run())
        await asyncio.sleep(WARMUP_S)
        latencies.clear()
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return {
        "arm": arm,
        "endpoints": endpoints,
        "cpu_ms_per_endpoint_s": cpu * 1000 / endpoints / wall,
        "cores": cpu / wall,
        "scrapes": len(latencies),
        "latency_p50_ms": pct(latencies, 50),
        "latency_p99_ms": pct(latencies, 99),
        "failures": len(failures),
        "first_failure": failures[0] if failures else None,
    }


def child(arm: str, endpoints: int, port: int, seconds: float) -> None:
    """One arm's run, printed as JSON (the body of ``_child``'s process)."""
    print(json.dumps(asyncio.run(scrape_for(arm, endpoints, port, seconds))))


def _child(arm: str, endpoints: int, port: int, seconds: float) -> dict[str, Any]:
    """One arm in a fresh process (nothing warmed by the other arm)."""
    code = f"from benchmarks.scrape import child; child({arm!r}, {endpoints}, {port}, {seconds})"
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    if done.returncode != 0:
        raise click.ClickException(f"the {arm} arm failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _table(rows: list[dict[str, Any]]) -> str:
    header = [
        "endpoints",
        "arm",
        "CPU ms / endpoint / s",
        "cores",
        "scrape p50 ms",
        "scrape p99 ms",
        "scrapes",
        "failed",
    ]
    body = []
    for n in sorted({r["endpoints"] for r in rows}):
        for arm in ARMS:
            mine = [r for r in rows if r["endpoints"] == n and r["arm"] == arm]
            body.append(
                [
                    n,
                    arm,
                    f"{median([r['cpu_ms_per_endpoint_s'] for r in mine]):.3f}",
                    f"{median([r['cores'] for r in mine]):.3f}",
                    f"{median([r['latency_p50_ms'] for r in mine]):.1f}",
                    f"{median([r['latency_p99_ms'] for r in mine]):.1f}",
                    sum(r["scrapes"] for r in mine),
                    sum(r["failures"] for r in mine),
                ]
            )
    return markdown_table(header, body)


@click.command()
@click.option("--endpoints", default="1,50,200", show_default=True, help="N, comma-separated")
@click.option("--seconds", default=15.0, show_default=True, help="measured per arm and round")
@click.option("--rounds", default=2, show_default=True)
@click.option("--out", default="bench-out", show_default=True)
def main(endpoints: str, seconds: float, rounds: int, out: str) -> None:
    """Scrape cost per endpoint: today's filtered parse against the full parse."""
    counts = [int(n) for n in endpoints.split(",")]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", f"from benchmarks.scrape import serve; serve({port})"]
    )
    try:
        _wait_up(port)
        rows = []
        for round_ in range(rounds):
            for n in counts:
                order = ARMS if (round_ + n) % 2 == 0 else ARMS[::-1]
                rows += [_child(arm, n, port, seconds) for arm in order]
    finally:
        server.terminate()
        server.wait(timeout=10)
    failed = sum(r["failures"] for r in rows)
    text = _table(rows) + f"\n\n{machine()['cores']} cores; engine pages: {FIXTURE.name}."
    save(out, "scrape", {"machine": machine(), "rows": rows}, text)
    click.echo(text)
    if failed:
        first = next(r["first_failure"] for r in rows if r["failures"])
        raise click.ClickException(f"{failed} scrapes failed (first: {first})")


def _wait_up(port: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/e0/metrics", timeout=1).raise_for_status()
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise click.ClickException("the engines' /metrics server did not start")


if __name__ == "__main__":
    main()
