"""Dispatch throughput: jobs per second that one dispatcher process moves into ready streams.

The engines admit freely (static admission, a huge in-flight cap) and no worker
runs, so the dispatcher alone is measured. For each case (users x models) the
jobs are queued first, then a ``fairq dispatcher`` process starts; the rate is
the jobs dispatched over the span between the first and the last ready-stream
entry (Redis stamps each entry id with its time), so process start-up and the
lease hand-shake are not counted. The cases take turns for ``--rounds`` rounds and each
reports its median round. Also reported: the dispatcher's and Redis's
CPU over the run, which tell which side bounds the rate.

Run with ``python -m benchmarks.scale.dispatch`` (part of ``make bench``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import psutil
import redis
import yaml

from benchmarks.lib.stats import machine, markdown_table, save
from broker import JobQueue, RequestKind, Settings, StreamMode, Submission, connect, keys
from fairq.stack.localredis import LocalRedis

CASES = ((10, 1), (10_000, 1), (10, 100), (10_000, 100))  # (users, models)
PAYLOAD = b'{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":8}'


def config(models: int) -> dict[str, object]:
    model = {"endpoints": ["http://127.0.0.1:9"], "admission": "static", "inflight_cap": 10**6}
    return {
        "models": [{"name": f"m{i}", **model} for i in range(models)],
        "max_queued_per_user": 1_000_000,
    }


async def fill(settings: Settings, jobs: int, users: int, models: int) -> None:
    """Queue ``jobs`` jobs, spread evenly over the users and the models."""
    client = connect(settings)
    queue = JobQueue(client, settings)
    try:
        for start in range(0, jobs, 500):
            await asyncio.gather(*(
                queue.submit(Submission(
                    model=f"m{i % models}", owner=f"u{i % users}", user=f"u{i % users}",
                    tenant="t", band="default", kind=RequestKind.CHAT,
                    stream_flag=StreamMode.STREAMED, payload=PAYLOAD,
                ))
                for i in range(start, min(start + 500, jobs))
            ))  # fmt: skip
    finally:
        await client.aclose()


def dispatched(r: redis.Redis, models: int) -> tuple[int, float]:
    """Jobs in the ready streams, and the ms between the first and the last entry."""
    count, first, last = 0, float("inf"), 0.0
    for i in range(models):
        stream = keys.ready(f"m{i}")
        count += r.xlen(stream)
        head, tail = _entry_ms(r.xrange(stream, count=1)), _entry_ms(r.xrevrange(stream, count=1))
        if head is not None and tail is not None:
            first, last = min(first, head), max(last, tail)
    return count, last - first


def _entry_ms(entries: Any) -> int | None:
    """The time part of the first entry's id (ms), or None for no entry."""
    return int(entries[0][0].split(b"-")[0]) if entries else None


def redis_cpu_s(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def profiler(pid: int, folder: str | None, name: str) -> subprocess.Popen[bytes] | None:
    """py-spy recording ``pid`` into ``folder``/``name``.txt (collapsed stacks, the input
    of flamegraph tools; ``--idle`` off, so it shows where the CPU goes), or None."""
    if folder is None:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    out = Path(folder, f"{name}.txt")
    beside = Path(sys.executable).with_name("py-spy")  # the venv's, when not on PATH
    binary = str(beside) if beside.exists() else "py-spy"
    spy = subprocess.Popen([binary, "record", "--pid", str(pid), "--rate", "250",
                            "--format", "raw", "--output", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(1)  # attached before the dispatcher takes its lease and starts
    return spy


def run_case(users: int, models: int, jobs: int, profile: str | None = None) -> dict[str, object]:
    with LocalRedis() as server, tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp, "fairq.yaml")
        cfg.write_text(yaml.safe_dump(config(models)))
        env = {**os.environ, "FAIRQ_CONFIG": str(cfg), "FAIRQ_REDIS_URL": server.url,
               "FAIRQ_LOG_LEVEL": "WARNING", "FAIRQ_METRICS_PORT": "0"}  # fmt: skip
        settings = Settings(redis_url=server.url, **config(models))  # type: ignore[arg-type]
        asyncio.run(fill(settings, jobs, users, models))
        r = redis.Redis.from_url(server.url)
        redis_before = redis_cpu_s(r)
        proc = subprocess.Popen([sys.executable, "-m", "fairq", "dispatcher"], env=env)
        spy = profiler(proc.pid, profile, f"dispatcher-{users}u-{models}m")
        try:
            deadline = time.monotonic() + 300
            while dispatched(r, models)[0] < jobs and time.monotonic() < deadline:
                time.sleep(0.2)
            count, span_ms = dispatched(r, models)
            times = psutil.Process(proc.pid).cpu_times()
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                spy.wait(timeout=30)
            proc.terminate()
            proc.wait(timeout=10)
        redis_s = redis_cpu_s(r) - redis_before
        r.close()
    if count < jobs:
        raise RuntimeError(f"only {count} of {jobs} jobs were dispatched within 300 s")
    rate = count / max(span_ms / 1000, 1e-3)
    return {"users": users, "models": models, "jobs": count, "jobs_per_s": rate,
            "dispatcher_cpu_s": times.user + times.system, "redis_cpu_s": redis_s}  # fmt: skip


def median_case(results: list[dict[str, object]]) -> dict[str, object]:
    """The round with the median rate (the upper one of an even count), with every round's rate."""
    ranked = sorted(results, key=lambda c: c["jobs_per_s"])  # type: ignore[arg-type,return-value]
    rates = [c["jobs_per_s"] for c in results]
    return {**ranked[len(ranked) // 2], "rounds_jobs_per_s": rates}


def render(result: dict[str, object]) -> str:
    rows = [[c["users"], c["models"], c["jobs"], round(c["jobs_per_s"]),
             c["dispatcher_cpu_s"], c["redis_cpu_s"]] for c in result["cases"]]  # type: ignore[attr-defined]  # fmt: skip
    table = markdown_table(
        ["users", "models", "jobs", "jobs/s", "dispatcher CPU s", "Redis CPU s"], rows
    )
    m = result["machine"]
    return (
        f"{table}\n\nslowdown at 10,000 users vs 10: {result['user_slowdown']}; "
        f"each case the median of {result['rounds']} rounds; one dispatcher process, "
        f"Redis on the same machine, {m['cores']} cores."  # type: ignore[index]
    )


@click.command()
@click.option("--jobs", default=20_000, show_default=True, help="jobs per case")
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    help="rounds of every case, in turn; each case reports its median round",
)
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
@click.option(
    "--profile",
    default=None,
    type=click.Path(),
    help="record each case's dispatcher with py-spy into this folder",
)
def main(jobs: int, rounds: int, out: str, profile: str | None) -> None:
    # The cases take turns, so a slow minute of the box falls on one round of each.
    runs = [[run_case(users, models, jobs, profile) for users, models in CASES]
            for _ in range(rounds)]  # fmt: skip
    cases = [median_case([run[i] for run in runs]) for i in range(len(CASES))]
    rate = {(c["users"], c["models"]): c["jobs_per_s"] for c in cases}
    slowdown = {
        f"{models} model(s)": round(rate[(10, models)] / rate[(10_000, models)], 2)  # type: ignore[operator]
        for models in (1, 100)
    }
    result = {"benchmark": "dispatch", "machine": machine(), "cases": cases,
              "rounds": rounds, "user_slowdown": slowdown}  # fmt: skip
    text = render(result)
    save(out, "dispatch", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
