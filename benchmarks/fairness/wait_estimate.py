"""Does ``queue_position.estimated_wait_s`` hold? Estimated against actual waits in floods.

Each flood (``--scenario seed,mixed``, the fairness benchmark's: ``scenarios``)
runs once on a fresh simulator (profile ``h100-8b``, the fairness benchmark's default)
and a fresh fairq stack with its defaults (the fairness benchmark's arm (c):
``stack``), after the same warm-up of the path. Beside the load, a side process
(``wait_sampler``) looks at every queued job as soon as it sees it queued, a tick
(``--tick-s``) at most after it queued, with the call GET /v1/jobs/{id} makes; after the
flood it has each job's dispatch time. Reported per flood (``wait_summary``): the queued
jobs, how many were looked at and how soon, the share whose first look showed a number,
the median of estimate over actual wait, the share within 2x, and why any estimate was
null. Written as ``wait_estimate.md`` and ``wait_estimate.json`` to ``--out``, and each
flood's looks (with what each read: ``broker.position.Observed``) and the sampler's ticks
as ``wait_estimate-<flood>.json``, to replay other estimates on the same flood.

A flood with any failed request is FAILED (its figures are shown, but it does not hold)
and the command exits 1.

Run it as ``python -m benchmarks.fairness.wait_estimate --out DIR``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import math
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import httpx
import orjson
import psutil

from benchmarks.fairness import options
from benchmarks.fairness.arms import ARMS
from benchmarks.fairness.checks import FAILED
from benchmarks.fairness.measure import PATH_IDLE_REQUESTS, check_context, idle_ttft_s
from benchmarks.fairness.scenarios import Scenario, plan
from benchmarks.fairness.stack import ArmEnv, Setup, arm_env
from benchmarks.fairness.wait_sampler import READY
from benchmarks.fairness.wait_summary import flood_figures, holds, render
from benchmarks.lib.load import run_load
from benchmarks.lib.provision import EngineChoice
from benchmarks.lib.stats import machine

ARM = ARMS["c"]  # fairq's defaults
_ERRORS = (RuntimeError, TimeoutError, OSError, ValueError, httpx.HTTPError, psutil.Error)


def say(message: str) -> None:
    click.echo(f"wait_estimate: {message}", err=True)


class _Sampler:
    """The side process (``wait_sampler``), started and ready."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    async def stop(self) -> dict[str, Any]:
        """Stop it; its spells and what each tick saw."""
        out, _ = await self._process.communicate(b"stop\n")
        if self._process.returncode != 0:
            raise RuntimeError(f"the sampler exited {self._process.returncode}")
        sampled: dict[str, Any] = orjson.loads(out)
        return sampled


@contextlib.asynccontextmanager
async def _sampler(env: ArmEnv, model: str, tick_s: float) -> AsyncIterator[_Sampler]:
    stack = env.stacks[0]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.fairness.wait_sampler", model, str(tick_s), env=stack.env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        if await process.stdout.readline() != READY:
            raise RuntimeError("the sampler did not start")
        yield _Sampler(process)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def _measure(env: ArmEnv, setup: Setup, tick_s: float, deadline_s: float) -> dict[str, Any]:
    check_context(env.engine_url, setup)
    # As the fairness benchmark's arms: the path warmed up (and the model's first ends seen)
    await idle_ttft_s(env.target, PATH_IDLE_REQUESTS, setup.scenario.light_output_tokens)
    async with _sampler(env, setup.model, tick_s) as sampler:
        load = await run_load(env.target, plan(setup.scenario), deadline_s, dead=env.dead)
        sampled = await sampler.stop()
    scenario = setup.scenario
    users = {*scenario.heavy_users(), *scenario.light_user_names()}  # not the warm-up's
    spells = [s for s in sampled["spells"] if s["user"] in users]
    failed = load.failed
    flood: dict[str, Any] = {
        "status": FAILED if failed or load.stopped else "ok",
        "requests": len(load.requests),
        "failed_requests": len(failed),
        "wall_s": load.wall_s,
        "figures": flood_figures(spells, scenario.light_user_names()),
        "spells": spells,
        "ticks": sampled["ticks"],
    }
    if failed or load.stopped:
        flood["error"] = load.stopped or failed[0].error
    return flood


def run_flood(scenario: Scenario, engine: EngineChoice, tick_s: float, deadline_s: float
              ) -> dict[str, Any]:  # fmt: skip
    """One flood on a fresh engine and stack; a failure to run is a FAILED flood."""
    setup = Setup(scenario, engine)
    say(f"{scenario.name}: running")
    try:
        with arm_env(ARM, setup) as env:
            flood = asyncio.run(_measure(env, setup, tick_s, deadline_s))
    except _ERRORS as exc:
        say(f"{scenario.name}: FAILED: {exc}")
        return {"status": FAILED, "error": str(exc)}
    if flood["status"] == FAILED:
        say(f"{scenario.name}: FAILED: {flood['failed_requests']} requests; {flood['error']}")
    return {"scenario": asdict(scenario), **flood}


def run(scenarios: list[Scenario], engine: EngineChoice, tick_s: float, deadline_s: float
        ) -> dict[str, Any]:  # fmt: skip
    floods = {s.name: run_flood(s, engine, tick_s, deadline_s) for s in scenarios}
    return {
        "benchmark": "wait_estimate",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "engine": f"simulator, profile {engine.profile}",
        "fairq": ARM.title,
        "tick_s": tick_s,
        "note": f"Simulator profile {engine.profile}, fairq's defaults. {engine.note}",
        "floods": floods,
        "failed": [name for name, f in floods.items() if f["status"] == FAILED],
    }


def write(result: dict[str, Any], out: Path) -> str:
    """The table, the figures, and each flood's looks (with what each read) and ticks
    apart in ``wait_estimate-<flood>.json``; returns the table."""
    out.mkdir(parents=True, exist_ok=True)
    markdown = render(result)
    floods = {}
    for name, flood in result["floods"].items():
        raw = {k: flood[k] for k in _RAW if k in flood}
        (out / f"wait_estimate-{name}.json").write_bytes(orjson.dumps(_finite(raw)))
        floods[name] = {k: v for k, v in flood.items() if k not in _RAW}
    figures = _finite({**result, "floods": floods})
    (out / "wait_estimate.json").write_text(json.dumps(figures, indent=1))
    (out / "wait_estimate.md").write_text(markdown + "\n")
    return markdown


_RAW = ("spells", "ticks")


def _finite(value: Any) -> Any:
    """NaN as None: JSON has no such number."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


@click.command(name="wait-estimate")
@click.option("--scenario", "names", default="seed,mixed", show_default=True,
              help="floods of the fairness benchmark: seed, long, mixed")  # fmt: skip
@click.option("--profile", default="h100-8b", show_default=True, help="simulator profile")
@click.option("--power-requests", type=int, help="each heavy user's flood at t=0")
@click.option("--prompt-tokens", type=int, help="per heavy request")
@click.option("--output-tokens", type=int, help="per heavy request (seed, mixed)")
@click.option("--light-users", type=int)
@click.option("--light-output-tokens", type=int)
@click.option("--light-start-s", type=float)
@click.option("--light-interval-s", type=float)
@click.option("--tick-s", default=0.2, show_default=True, help="the sampler's period")
@click.option("--timeout-s", default=900.0, show_default=True, help="per flood")
@click.option("--out", default="bench-out/wait_estimate", show_default=True, type=click.Path())
def main(*, names: str, profile: str, tick_s: float, timeout_s: float, out: str,
         **sizes: Any) -> None:  # fmt: skip
    """Estimated against actual queue waits in the seed and mixed floods (simulator)."""
    engine = options.engine_choice(options.EngineFlags("sim", profile, None, None, None, False,
                                                       None))  # fmt: skip
    scenarios = options.scenarios((names,), "h100", engine, sizes)
    result = run(scenarios, engine, tick_s, timeout_s)
    click.echo(write(result, Path(out)))
    say(f"wrote {out}/wait_estimate.md and wait_estimate.json")
    for name, flood in result["floods"].items():
        say(f"{name}: {flood['status']}, criterion {'holds' if holds(flood) else 'missed'}")
    if result["failed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
