"""Fairness under a flood: one power user against light users, six arms in one run.

The seed scenario: user A sends 500 requests at t=0 (~1,000 prompt and 200
output tokens each); users B and C send one streamed request each at t≈1 s,
and more light users trickle in every few seconds. The same scenario runs
against each arm (see ``_fairness_arms``) on a fresh stack with the same engine
profile, one arm after the other. Reported per arm: the light users' TTFT
p50/p95/max, when the power user's last answer came, total output tokens/s,
and the engine's queue over time; written as ``fairness.md``, ``fairness.json``
and ``fairness.png`` to the output folder.

Run it as ``fairq bench fairness`` or ``python -m benchmarks.fairness``. By
default each arm gets its own simulator (profile ``h100-8b``: its figures are
estimates); ``--engine-url`` runs the arms against an engine you started.

The harness: ``_fairness_load`` (the scenario's requests), ``_fairness_engine``
(/metrics over time), ``_fairness_arms`` and ``_fairness_stack`` (what each arm
runs), ``_fairness_measure`` (one arm), ``_fairness_report`` and
``_fairness_plot`` (the outputs).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from benchmarks._fairness_arms import (
    ArmSpec,
    config_problem,
    engine_priority_problem,
    parse_arms,
)
from benchmarks._fairness_engine import served_model, wait_idle
from benchmarks._fairness_load import Scenario
from benchmarks._fairness_measure import measure_arm
from benchmarks._fairness_plot import plot
from benchmarks._fairness_report import compare, criteria, render
from benchmarks._fairness_stack import SIM_MODEL, Setup, arm_env, fairq_priority_problem
from benchmarks.stats import machine
from broker import ModelConfig

DEFAULT_PROFILE = "h100-8b"
IDLE_WAIT_S = 600.0


@dataclass(frozen=True)
class Options:
    scenario: Scenario
    arms: list[ArmSpec]
    profile: str
    engine_url: str | None
    model: str | None
    out: Path
    arm_timeout_s: float


def _say(message: str) -> None:
    click.echo(f"fairness: {message}", err=True)


def run(options: Options) -> dict[str, Any]:
    """Every arm in order; returns the run's figures (JSON-ready)."""
    if options.engine_url is None:
        model = SIM_MODEL
    else:
        model = options.model or served_model(options.engine_url)
    setup = Setup(options.scenario, options.profile, options.engine_url, model)
    arms: dict[str, dict[str, Any]] = {}
    idle_ms: float | None = None
    for spec in options.arms:
        arm, idle_s = _run_arm(spec, setup, options, measure_idle=idle_ms is None)
        arms[spec.key] = {"title": spec.title, **arm}
        if idle_s is not None:
            idle_ms = idle_s * 1000
    compare(arms, idle_ms)
    result: dict[str, Any] = _finite(
        {
            "benchmark": "fairness",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "engine": _engine_label(options, model),
            "simulated": options.engine_url is None,
            "scenario": asdict(options.scenario),
            "idle_ttft_ms": idle_ms,
            "arms": arms,
            "criteria": criteria(arms),
        }
    )
    return result


def _finite(value: Any) -> Any:
    """NaN and infinity as None: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _engine_label(options: Options, model: str) -> str:
    if options.engine_url is None:
        return f"engine simulator, profile {options.profile}"
    return f"engine at {options.engine_url} (model {model})"


def _run_arm(
    spec: ArmSpec, setup: Setup, options: Options, *, measure_idle: bool
) -> tuple[dict[str, Any], float | None]:
    problem = _problem(spec, setup)
    if problem is not None:
        _say(f"arm ({spec.key}) {spec.title}: not available: {problem}")
        return {"available": False, "reason": problem}, None
    _say(f"arm ({spec.key}) {spec.title}: running")
    try:
        if setup.engine_url is not None:
            asyncio.run(wait_idle(setup.engine_url, setup.model, IDLE_WAIT_S))
        with arm_env(spec, setup) as env:
            arm, idle_s = asyncio.run(
                measure_arm(env, setup, options.arm_timeout_s, _tpot_ceiling_ms(), measure_idle)
            )
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        _say(f"arm ({spec.key}) failed: {exc}")
        return {"available": False, "reason": f"failed: {exc}"}, None
    _say(f"arm ({spec.key}) done: {arm['output_tok_s']:.0f} output tok/s")
    return arm, idle_s


def _problem(spec: ArmSpec, setup: Setup) -> str | None:
    """Why the arm cannot run here: fairq lacks its feature, or the engine its policy."""
    engine_url = setup.engine_url or "http://127.0.0.1:1"
    problem = config_problem(spec, setup.model, engine_url)
    if problem is None and spec.engine_priority and setup.engine_url is not None:
        problem = engine_priority_problem(setup.engine_url, setup.model)
    if problem is None and spec.engine_priority and spec.via_fairq:
        problem = fairq_priority_problem()
    return problem


def _tpot_ceiling_ms() -> float:
    return float(ModelConfig.model_fields["tpot_ceiling_ms"].default)


def write(result: dict[str, Any], out: Path) -> str:
    """Write the JSON, markdown and PNG; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    markdown = render(result)
    (out / "fairness.json").write_text(json.dumps(result, indent=1))
    (out / "fairness.md").write_text(markdown + "\n")
    plot(result, out / "fairness.png")
    return markdown


@click.command(name="fairness")
@click.option("--power-requests", default=500, show_default=True, help="user A's flood at t=0")
@click.option("--prompt-tokens", default=1000, show_default=True, help="per power request")
@click.option("--output-tokens", default=200, show_default=True, help="per power request")
@click.option("--light-users", default=6, show_default=True, help="B, C at once, then one by one")
@click.option("--light-output-tokens", default=50, show_default=True)
@click.option("--light-start-s", default=1.0, show_default=True, help="when B and C send")
@click.option("--light-interval-s", default=5.0, show_default=True, help="between later users")
@click.option("--arms", "arm_keys", default="a,b,c,d,e,f", show_default=True)
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              help="simulator profile name or YAML path")  # fmt: skip
@click.option("--engine-url", default=None, help="run against this engine, not a simulator")
@click.option("--model", default=None, help="with --engine-url [the engine's first model]")
@click.option("--out", default="bench-out/fairness", show_default=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
@click.option("--arm-timeout-s", default=900.0, show_default=True, help="per arm's flood")
def main(*, arm_keys: str, profile: str, engine_url: str | None, model: str | None, out: str,
         as_json: bool, arm_timeout_s: float, **sizes: Any) -> None:  # fmt: skip
    """Fairness under a flood: light users' TTFT while one user sends hundreds of requests."""
    try:
        arms = parse_arms(arm_keys)
        scenario = _scenario(sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if importlib.util.find_spec("matplotlib") is None:  # found now, not after the run
        raise click.UsageError("the plot needs matplotlib: pip install 'fairq[bench]'")
    url = engine_url.rstrip("/") if engine_url else None
    options = Options(scenario, arms, profile, url, model, Path(out), arm_timeout_s)
    try:
        result = run(options)
    except KeyboardInterrupt:
        _say("interrupted; every stack was stopped")
        sys.exit(130)
    markdown = write(result, options.out)
    click.echo(json.dumps(result, indent=1) if as_json else markdown)
    _say(f"wrote {options.out}/fairness.md, fairness.json and fairness.png")


def _scenario(sizes: dict[str, Any]) -> Scenario:
    scenario = Scenario(**sizes)
    if scenario.power_requests < 1 or scenario.prompt_tokens < 1 or scenario.output_tokens < 1:
        raise ValueError("--power-requests, --prompt-tokens and --output-tokens must be >= 1")
    if scenario.light_users < 1 or scenario.light_output_tokens < 1:
        raise ValueError("--light-users and --light-output-tokens must be >= 1")
    return scenario


if __name__ == "__main__":
    main()
