"""Fairness under a flood: heavy users against light users, every arm side by side.

Scenarios (``--scenario seed,long,mixed``; ``scenarios``): the seed flood (user A's 500
requests at t=0, light users trickling in), a long-generation flood (A's streamed long
answers fill the engine's whole batch before the light users come), and a mixed load (heavy
users of weights 1, 2 and 4, light users at Poisson times). Each scenario runs against every
arm (``arms``), one after the other, each on a fresh engine and stack with the same profile.

Reported per arm and scenario: the light users' TTFT p50/p95/max in milliseconds
and in engine steps (the engine's own mean time per output token during the
flood), when the heavy users' last answer came, output tokens/s against arm (a),
the engine's preemptions, and the CPU seconds of fairq's processes, the engine
and the load client; in the mixed scenario, each heavy user's share of output
tokens next to its weight's share. Written as ``fairness.md``, ``fairness.json``
and ``fairness-<scenario>.png`` to the output folder.

A run cannot pass on failures: an arm with any failed request is FAILED, every
check involving it does not hold, and the command exits 1. A scenario that does
not fit the engine's context (its GET /v1/models) is refused before any arm runs.

Run it as ``fairq bench fairness`` or ``python -m benchmarks.fairness.cli``. Engines:
``--engine sim`` (default; profile ``h100-8b``: its figures are estimates),
``--engine vllm`` (a real vLLM per arm, the tiny model; pinned to core 0 with
fairq and the client on core 1), or ``--engine-url`` (its scheduling policy from
``--engine-policy`` or from the engine, else unknown: ``arms``).

The harness: ``scenarios`` and ``benchmarks.lib.load`` (the requests), ``benchmarks.lib.sse``
(reading streams), ``benchmarks.lib.engine_watch`` (/metrics over time), ``arms``,
``benchmarks.lib.provision`` and ``stack`` (what each arm runs), ``benchmarks.lib.cpu`` (CPU
and pinning), ``measure`` (one arm), ``shares``, ``checks``, ``report`` and ``plot`` (the
outputs); ``options`` reads the flags.
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click
import httpx
import psutil

from benchmarks.fairness import options
from benchmarks.fairness.arms import (
    ENGINE_POLICIES,
    ArmSpec,
    arm_title,
    config_problem,
    policy,
    policy_problem,
)
from benchmarks.fairness.checks import FAILED, NOT_AVAILABLE, criteria
from benchmarks.fairness.matrix import MATRIX_ARMS, parse_cells, sizes, verdict
from benchmarks.fairness.matrix import render as render_matrix
from benchmarks.fairness.measure import measure_arm
from benchmarks.fairness.options import Options
from benchmarks.fairness.plot import plot
from benchmarks.fairness.report import compare, render
from benchmarks.fairness.scenarios import FAMILIES, Scenario, parse_names
from benchmarks.fairness.stack import Setup, arm_env
from benchmarks.lib.engine_watch import wait_idle
from benchmarks.lib.provision import EngineChoice, prepare_vllm
from benchmarks.lib.stats import machine
from benchmarks.lib.vllm_engine import interrupt_on_sigterm
from broker import ModelConfig
from fairq.runtime import environment

IDLE_WAIT_S = 600.0
DEFAULT_ARMS = "a,b,c,d,e,f,g,h,i,j,k,l,t"
PINNING = "engine on core 0; fairq's processes and the load client on core 1"
_ARM_ERRORS = (RuntimeError, TimeoutError, OSError, ValueError, httpx.HTTPError, psutil.Error)


def say(message: str) -> None:
    click.echo(f"fairness: {message}", err=True)


def run(options: Options) -> dict[str, Any]:
    """Every scenario, every arm in order; returns the run's figures (JSON-ready)."""
    problems = {spec.key: _problem(spec, options.engine) for spec in options.arms}
    sections = {s.name: _run_scenario(s, options, problems) for s in options.scenarios}
    result: dict[str, Any] = _finite(
        {
            "benchmark": "fairness",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "engine": options.engine.label,
            "engine_kind": options.engine.kind,
            "simulated": options.engine.kind == "sim",
            "cpu_pinning": PINNING if options.engine.pinning else "off",
            "engine_note": options.engine.note,
            "scenarios": sections,
            "failed_arms": failed_arms(sections),
        }
    )
    return result


def failed_arms(sections: dict[str, Any]) -> list[str]:
    """``scenario (key)`` of every FAILED arm."""
    return [
        f"{name} ({key})"
        for name, section in sections.items()
        for key, arm in section["arms"].items()
        if arm["status"] == FAILED
    ]


def _run_scenario(
    scenario: Scenario, options: Options, problems: dict[str, str | None]
) -> dict[str, Any]:
    setup = Setup(scenario, options.engine)
    arms: dict[str, dict[str, Any]] = {}
    idle_ms: float | None = None
    for spec in options.arms:
        runs = problems[spec.key] is None
        title = arm_title(spec, options.engine.ran(policy(spec)), runs=runs)
        arm, idle_s = _run_arm(
            spec, title, setup, options, problem=problems[spec.key], measure_idle=idle_ms is None
        )
        arms[spec.key] = {"title": title, **arm}
        if idle_s is not None:
            idle_ms = idle_s * 1000
    compare(arms)
    return {
        "scenario": asdict(scenario),
        "idle_ttft_ms": idle_ms,
        "arms": arms,
        "criteria": criteria(scenario.name, arms),
    }


def _finite(value: Any) -> Any:
    """NaN and infinity as None: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _run_arm(spec: ArmSpec, title: str, setup: Setup, options: Options, *, problem: str | None,
             measure_idle: bool) -> tuple[dict[str, Any], float | None]:  # fmt: skip
    where = f"{setup.scenario.name} ({spec.key}) {title}"
    if problem is not None:
        say(f"{where}: not available: {problem}")
        return {"status": NOT_AVAILABLE, "reason": problem}, None
    say(f"{where}: running")
    try:
        if options.engine.kind == "url":
            assert options.engine.url is not None
            asyncio.run(wait_idle(options.engine.url, setup.model, IDLE_WAIT_S))
        with arm_env(spec, setup) as env:
            arm, idle_s = asyncio.run(
                measure_arm(env, setup, options.arm_timeout_s, _tpot_ceiling_ms(), measure_idle)
            )
    except _ARM_ERRORS as exc:
        say(f"{where}: FAILED: {exc}")
        return {"status": FAILED, "failed": {"count": None, "first_error": str(exc)}}, None
    if arm["status"] == FAILED:
        say(f"{where}: FAILED: {arm['failed']['count']} requests; {arm['failed']['first_error']}")
    else:
        say(f"{where}: done: {arm['output_tok_s']:.0f} output tok/s")
    return arm, idle_s


def _problem(spec: ArmSpec, engine: EngineChoice) -> str | None:
    """Why the arm cannot run here: fairq lacks its feature, or the engine its policy."""
    problem = config_problem(spec, engine.model, engine.url or "http://127.0.0.1:1")
    if problem is None and spec.told_batch and engine.batch_slots is None:
        problem = "the engine's batch is not known: give it with --engine-batch"
    if problem is None:
        problem = policy_problem(spec, engine.url, engine.ran(policy(spec)))
    return problem


def _tpot_ceiling_ms() -> float:
    return float(ModelConfig.model_fields["tpot_ceiling_ms"].default)


def write(result: dict[str, Any], out: Path) -> str:
    """Write the JSON, markdown and a PNG per scenario; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    markdown = render(result)
    (out / "fairness.json").write_text(json.dumps(result, indent=1))
    (out / "fairness.md").write_text(markdown + "\n")
    for name, section in result["scenarios"].items():
        plot(section, result, out / f"fairness-{name}.png")
    return markdown


def finish(result: dict[str, Any], options: Options, as_json: bool) -> None:
    """Write and print the run; exit 1 when any arm FAILED."""
    markdown = write(result, options.out)
    click.echo(json.dumps(result, indent=1) if as_json else markdown)
    names = ", ".join(f"fairness-{s.name}.png" for s in options.scenarios)
    say(f"wrote {options.out}/fairness.md, fairness.json and {names}")
    if result["failed_arms"]:
        say(f"FAILED arms: {', '.join(result['failed_arms'])}")
        sys.exit(1)


def main_run(options: Options, as_json: bool) -> None:
    interrupt_on_sigterm()
    try:
        result = run(options)
    except KeyboardInterrupt:
        say("interrupted; every engine and stack was stopped")
        sys.exit(130)
    finish(result, options, as_json)


@click.command(
    name="fairness",
    epilog=environment(("FAIRQ_VLLM_HOME", "as --vllm-home [.vllm at the repository root]")),
)
@click.option(
    "--scenario",
    "scenario_names",
    multiple=True,
    help="seed, long, mixed: repeat the flag or give a comma list [seed]",
)
@click.option(
    "--sizes",
    type=click.Choice(FAMILIES),
    default=None,
    help="size presets [sim: h100; vllm: tiny; --engine-url: the first that fits]",
)
@click.option("--power-requests", type=int, help="each heavy user's flood at t=0")
@click.option("--prompt-tokens", type=int, help="per heavy request")
@click.option("--output-tokens", type=int, help="per heavy request (seed, mixed)")
@click.option("--long-output-tokens", help="MIN-MAX per long request, uniform (long)")
@click.option("--power-stream/--no-power-stream", default=None, help="heavy users stream")
@click.option("--heavy-weights", help="mixed: one heavy user per weight, e.g. 1,2,4")
@click.option("--light-users", type=int)
@click.option("--light-requests", type=int, help="per light user")
@click.option("--light-output-tokens", type=int)
@click.option("--light-start-s", type=float, help="when the first light users send")
@click.option(
    "--light-interval-s", type=float, help="between later light users (mixed: the mean Poisson gap)"
)
@click.option("--seed", type=int, help="of the answers' lengths and the Poisson arrivals")
@click.option("--arms", "arm_keys", default=None, help=f"[{DEFAULT_ARMS}; --matrix: {MATRIX_ARMS}]")
@click.option(
    "--engine",
    "engine_kind",
    type=click.Choice(["sim", "vllm"]),
    default="sim",
    show_default=True,
    help="a fresh simulator or real vLLM per arm",
)
@click.option(
    "--profile", default="h100-8b", show_default=True, help="simulator profile name or YAML path"
)
@click.option("--engine-url", default=None, help="run against this engine, not a fresh one")
@click.option(
    "--engine-policy",
    type=click.Choice(ENGINE_POLICIES),
    default=None,
    help="with --engine-url: the scheduling policy that engine runs [what it says on "
    "/server_info; else unknown, and the arms that send priorities do not run]",
)
@click.option("--model", default=None, help="with --engine-url [the engine's first model]")
@click.option(
    "--engine-batch",
    type=click.IntRange(min=1),
    default=None,
    help="the engine's batch (max_num_seqs): the simulator's or vLLM's; with --engine-url, "
    "what that engine runs [sim: the profile's; vllm: 8]. Only arm (t) is told it",
)
@click.option(
    "--engine-kv-tokens",
    type=click.IntRange(min=16),
    default=None,
    help="sim: the KV cache in tokens [the profile's]: a small one bounds the running set "
    "before the batch does",
)
@click.option(
    "--cpu-pinning/--no-cpu-pinning",
    default=None,
    help="engine on core 0, the rest on core 1 [on with vllm]",
)
@click.option(
    "--vllm-home",
    envvar="FAIRQ_VLLM_HOME",
    default=None,
    help="vLLM's venv and model [.vllm at the repository root]",
)
@click.option(
    "--matrix",
    "matrix_cells",
    default=None,
    help="the scenario matrix on the simulator: engines of batch 4, 16, 64, 256 and a "
    "KV-bound one (all, or e.g. 4,16,kv), each flood sized to it, arms a,e,c,t "
    "[--scenario default: seed,long,mixed]",
)
@click.option("--out", default="bench-out/fairness", show_default=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
@click.option("--arm-timeout-s", default=900.0, show_default=True, help="per arm's flood")
def main(*, scenario_names: tuple[str, ...], sizes: str | None, arm_keys: str, engine_kind: str,
         profile: str, engine_url: str | None, engine_policy: str | None, model: str | None,
         engine_batch: int | None, engine_kv_tokens: int | None, cpu_pinning: bool | None,
         vllm_home: str | None, matrix_cells: str | None, out: str, as_json: bool,
         arm_timeout_s: float, **size_flags: Any) -> None:  # fmt: skip
    """Fairness under a flood: light users' TTFT in engine steps while heavy users flood."""
    arms = options.arms(arm_keys or (MATRIX_ARMS if matrix_cells else DEFAULT_ARMS))
    if importlib.util.find_spec("matplotlib") is None:  # found now, not after the run
        raise click.UsageError("the plot needs matplotlib: pip install 'fairq[bench]'")
    flags = options.EngineFlags(
        engine_kind, profile, engine_url, engine_policy, model, cpu_pinning, vllm_home,
        engine_batch, engine_kv_tokens,
    )  # fmt: skip
    if matrix_cells is not None:
        matrix_main(matrix_cells, scenario_names=scenario_names, arms=arms, flags=flags,
                    size_flags=size_flags, out=Path(out), arm_timeout_s=arm_timeout_s)  # fmt: skip
        return
    engine = options.engine_choice(flags)
    chosen = options.scenarios(scenario_names or ("seed",), sizes, engine, size_flags)
    if engine.kind == "vllm":
        _prepare_vllm(engine)
    main_run(options.Options(chosen, arms, engine, Path(out), arm_timeout_s), as_json)


def matrix_main(cells_text: str, *, scenario_names: tuple[str, ...], arms: list[ArmSpec],
                flags: options.EngineFlags, size_flags: dict[str, Any], out: Path,
                arm_timeout_s: float) -> None:  # fmt: skip
    """``--matrix``: every cell, every flood, the arms side by side in each; one table."""
    if flags.kind != "sim" or flags.url is not None or flags.batch or flags.kv_tokens:
        raise click.UsageError(
            "--matrix runs the simulator, sized per cell: leave out --engine, --engine-url, "
            "--engine-batch and --engine-kv-tokens"
        )
    try:
        cells = parse_cells(cells_text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--matrix") from exc
    names = scenario_names or ("seed", "long", "mixed")
    given = {k: v for k, v in size_flags.items() if v is not None}
    result: dict[str, Any] = {"cells": {}}
    interrupt_on_sigterm()
    for cell in cells:
        engine = options.engine_choice(replace(flags, batch=cell.batch, kv_tokens=cell.kv_tokens))
        folder = out / cell.name.split(" (")[0].replace(" ", "-")
        for name in parse_names(names):
            chosen = options.scenarios((name,), "h100", engine, sizes(name, cell) | given)
            ran = run(options.Options(chosen, arms, engine, folder / name, arm_timeout_s))
            write(ran, folder / name)
            section = ran["scenarios"][name]
            section["matrix"] = verdict(section["arms"])
            result["cells"].setdefault(cell.name, {})[name] = section
            result |= {k: ran[k] for k in ("machine", "engine_note", "date")}
            _write_matrix(result, out)
    say(f"wrote {out}/matrix.md and matrix.json")
    failed = [
        f"{cell} {name}"
        for cell, sections in result["cells"].items()
        for name, section in sections.items()
        if section["matrix"]["holds"] is False
    ]
    if failed:
        say(f"the defaults missed in: {', '.join(failed)}")


def _write_matrix(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(_finite(result), indent=1))
    (out / "matrix.md").write_text(render_matrix(result) + "\n")


def _prepare_vllm(engine: EngineChoice) -> None:
    assert engine.vllm_home is not None
    say(f"preparing vLLM and its model in {engine.vllm_home}")
    try:
        prepare_vllm(engine.vllm_home)
    except (RuntimeError, OSError, ValueError) as exc:
        raise click.UsageError(f"vLLM is not ready: {exc}") from exc


if __name__ == "__main__":
    main()
