"""The throughput-and-scale suite in one command: ``python -m benchmarks.suite``.

Runs each benchmark as its own process (each brings up what it measures and tears it
down), collects the JSON each writes to ``--out``, and prints one table: every figure
next to its target. Each benchmark compares fairq with its baseline side by side in
its own run; this table only gathers them. Figures from the engine simulator are
estimates, not a GPU's. ``--quick`` runs smaller sizes (a smoke test of the suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from benchmarks.lib.stats import machine, markdown_table, save

Row = tuple[str, str, str, bool | None]  # figure, measured, target, holds (None: no target)


@dataclass(frozen=True)
class Step:
    """One benchmark: its module, its arguments (full and quick), and its rows."""

    name: str  # also the JSON file the module writes
    module: str
    args: tuple[str, ...]
    quick_args: tuple[str, ...]
    rows: Callable[[dict[str, Any]], list[Row]]


def _dispatch_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for c in r["cases"]:
        rate = c["jobs_per_s"]
        figure = (f"dispatch jobs/s, {c['users']:,} users, {c['models']} model(s), "
                  f"median of {r.get('rounds', 1)} rounds")  # fmt: skip
        rows.append((figure, f"{rate:,.0f}", ">= 5,000", rate >= 5000))
    for models, slowdown in r["user_slowdown"].items():
        figure = f"dispatch slowdown 10,000 vs 10 users, {models}"
        rows.append((figure, f"{slowdown:.2f}x", "< 2x", slowdown < 2))
    return rows


def _depth_rows(r: dict[str, Any]) -> list[Row]:
    empty, deep = r["arms"]
    rows: list[Row] = []
    for key, what in (("enqueue_p99_ms", "enqueue"), ("dispatch_round_p99_ms", "dispatch round")):
        ratio = deep[key] / empty[key]
        figure = (f"{what} p99 at {deep['queued_jobs']:,} queued vs almost empty "
                  f"({r['allocator']} malloc)")  # fmt: skip
        measured = f"{deep[key]:.2f} / {empty[key]:.2f} ms = {ratio:.2f}x"
        rows.append((figure, measured, "<= 2x", ratio <= 2))
    beyond = r["memory_per_job_beyond_payload_bytes"]
    rows.append(("Redis memory per queued job, beyond the payload", f"{beyond:.0f} B",
                 "<= 300 B", beyond <= 300))  # fmt: skip
    return rows


def _jobrate_rows(r: dict[str, Any]) -> list[Row]:
    rq = r["jobs_per_s"]["rq"]
    rows: list[Row] = [("plain RQ jobs/s (one worker per core)", f"{rq:,.0f}", "baseline", None)]
    for arm, ratio in r["vs_rq"].items():
        rate = r["jobs_per_s"][arm]
        rows.append((f"end-to-end jobs/s, {arm} (median of {r.get('rounds', 1)} rounds)",
                     f"{rate:,.0f} ({ratio:.1f}x RQ)", ">= 5x RQ",
                     ratio >= 5))  # fmt: skip
    return rows


def _latency_rows(r: dict[str, Any], where: str, judged: bool) -> list[Row]:
    """The latency targets judge an idle engine; under load the figure is reported."""
    a = r["added"]
    p50, p99 = a["ttft_p50_ms"], a["ttft_p99_ms"]
    if not judged:
        return [(f"added TTFT p50 / p99, {where}", f"{p50:.2f} / {p99:.2f} ms", "report", None)]
    return [
        (f"added TTFT p50, {where}", f"{p50:.2f} ms", "<= 5 ms", p50 <= 5),
        (f"added TTFT p99, {where}", f"{p99:.2f} ms", "<= 20 ms", p99 <= 20),
    ]


def _streaming_rows(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for c in r["cpu"]:
        if c["arm"] != "fairq":
            continue
        hop = c["hop_ms_per_1k_tokens"]  # the median of the rounds' worker + gateway
        where = (f"{c['streams']} stream(s), {r['tokens_per_request']} tokens/request, "
                 f"median of {c['rounds']} rounds")  # fmt: skip
        rows.append((f"worker + gateway CPU per 1,000 streamed tokens, {where}",
                     f"{hop:.0f} ms", "<= 50 ms", hop <= 50))  # fmt: skip
    for streams, us in r.get("relay_floor_us", {}).items():
        rows.append((f"floor: a bare relay's CPU per 1,000 tokens, {streams} stream(s)",
                     f"{us:.0f} ms", "-", None))  # fmt: skip
    f = r.get("fanout")
    if f:
        rows += [
            (f"fan-out {f['streams']:,} streams: tokens/s received (sent)",
             f"{f['tokens_per_s']:,.0f} ({f['target_tokens_per_s']:,.0f})", "-", None),
            (f"fan-out {f['streams']:,} streams: added ITL p99", f"{f['added_itl_p99_ms']:.0f} ms",
             "-", None),
            (f"fan-out {f['streams']:,} streams: gateway Redis connections",
             str(f["gateway_redis_connections"]), "<= 50", f["gateway_redis_connections"] <= 50),
        ]  # fmt: skip
    return rows


STEPS = (
    Step("dispatch", "benchmarks.scale.dispatch", (), ("--jobs", "4000", "--rounds", "1"),
         _dispatch_rows),
    Step("depth", "benchmarks.scale.depth", ("--jobs", "1000000"),
         ("--jobs", "20000", "--rounds", "50"), _depth_rows),
    Step("jobrate", "benchmarks.scale.jobrate", (), ("--jobs", "600", "--rq-jobs", "200"),
         _jobrate_rows),
    Step("latency", "benchmarks.streaming.latency", (), ("--requests", "60"),
         lambda r: _latency_rows(r, "idle engine", judged=True)),
    Step("latency_load", "benchmarks.streaming.latency", ("--load", "0.5"),
         ("--load", "0.5", "--requests", "60"),
         lambda r: _latency_rows(r, "engine at 50% load", judged=False)),
    Step("streaming", "benchmarks.streaming.hot_path",
         ("--concurrency", "1,50,200", "--fanout", "1000"),
         ("--concurrency", "1,50", "--seconds", "3", "--fanout", "100"), _streaming_rows),
    # The same hot path with longer answers: per-request work spread over more tokens.
    Step("streaming_long", "benchmarks.streaming.hot_path",
         ("--tokens", "400", "--concurrency", "50,200", "--fanout", "0", "--no-floor"),
         ("--tokens", "400", "--concurrency", "50", "--seconds", "3", "--fanout", "0",
          "--no-floor"), _streaming_rows),
)  # fmt: skip


def run_step(step: Step, out: Path, quick: bool) -> tuple[list[Row], float, str | None]:
    """Run one benchmark; its rows, its seconds, and why it failed (None when it did not)."""
    step_out = out / step.name
    args = step.quick_args if quick else step.args
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", step.module, *args, "--out", str(step_out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode != 0:
        return [], seconds, f"exit {done.returncode}: {done.stderr.strip()[-500:]}"
    files = sorted(step_out.glob("*.json"))
    if not files:
        return [], seconds, "wrote no JSON"
    return step.rows(json.loads(files[0].read_text())), seconds, None


@click.command()
@click.option("--out", default="bench-out/suite", show_default=True, type=click.Path())
@click.option("--quick", is_flag=True, help="small sizes: checks the suite runs, not the targets")
@click.option("--only", multiple=True, help="run only these steps (by name)")
def main(out: str, quick: bool, only: tuple[str, ...]) -> None:
    """Every throughput-and-scale figure next to its target, one table."""
    rows: list[Row] = []
    failures: dict[str, str] = {}
    for step in STEPS:
        if only and step.name not in only:
            continue
        click.echo(f"suite: {step.name} ...", err=True)
        step_rows, seconds, error = run_step(step, Path(out), quick)
        click.echo(f"suite: {step.name} took {seconds:.0f} s", err=True)
        rows += step_rows
        if error is not None:
            failures[step.name] = error
    table = markdown_table(
        ["figure", "measured", "target", "holds"],
        [[f, m, t, "-" if h is None else ("yes" if h else "**no**")] for f, m, t, h in rows],
    )
    cores = machine()["cores"]
    text = f"{table}\n\n{cores} cores; engine = fairq's simulator (estimates)."
    if quick:
        text += " Quick sizes: not the figures the targets are judged on."
    for name, error in failures.items():
        text += f"\n\n{name} FAILED: {error}"
    result = {"benchmark": "suite", "machine": machine(), "quick": quick,
              "rows": [list(r) for r in rows], "failures": failures}  # fmt: skip
    save(out, "suite", result, text)
    click.echo(text)
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
