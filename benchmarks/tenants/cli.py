"""``fairq bench tenants``: the interactive tail, its arms side by side, on the simulator
or a real vLLM (CPU build, tiny model), sized by the engine's preset unless told."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import click

from benchmarks.lib.provision import (
    SIM_MODEL,
    VLLM_CONTEXT,
    VLLM_MODEL,
    EngineChoice,
    prepare_vllm,
    vllm_home,
)
from benchmarks.lib.stats import machine, save
from benchmarks.tenants.plan import PRESETS, TailSizes
from benchmarks.tenants.report import render, verdict
from benchmarks.tenants.run import ARMS, run_arm
from fairq.runtime import environment

# The engines' batches the presets half load: the simulator's max_num_seqs, vLLM's.
ENGINE_BATCH = {"sim": 32, "vllm": 8}
_SIZES = (
    ("--interactive-requests", int, "interactive requests, each sent in both phases"),
    ("--rate", float, "interactive requests per second (Poisson)"),
    ("--interactive-users", int, "users the interactive requests come from, in turn"),
    ("--prompt-tokens", int, "per request"),
    ("--output-tokens", int, "per interactive answer"),
    ("--power-requests", int, "the power user's flood at t=0"),
    ("--power-output-tokens", int, "per flood answer"),
    ("--batch-lines", int, "the batch tenant's lines at t=0"),
    ("--batch-output-tokens", int, "per batch line"),
)


def _size_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for flag, kind, what in reversed(_SIZES):
        command = click.option(flag, type=kind, default=None, help=f"{what} [the engine's preset]")(
            command
        )
    return command


@click.command(
    "tenants",
    epilog=environment(("FAIRQ_VLLM_HOME", "as --vllm-home [.vllm at the repository root]")),
)
@click.option("--arms", default="a,e,c", show_default=True, help=f"of {','.join(ARMS)}")
@click.option(
    "--engine",
    type=click.Choice(["sim", "vllm"]),
    default="sim",
    show_default=True,
    help="a fresh simulator (h100 preset) or real vLLM (tiny preset) per arm",
)
@click.option("--profile", default="h100-8b", show_default=True, help="simulator profile")
@click.option(
    "--engine-batch",
    type=click.IntRange(1),
    default=None,
    help="the engine's max_num_seqs [sim 32, vllm 8]",
)
@click.option("--vllm-home", default=None, help="vLLM's venv and model [.vllm]")
@_size_options
@click.option("--seed", default=0, show_default=True)
@click.option("--arm-timeout-s", default=900.0, show_default=True, help="per phase")
@click.option("--out", default="bench-out/tenants", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def main(
    *,
    arms: str,
    engine: str,
    profile: str,
    engine_batch: int | None,
    vllm_home: str | None,
    arm_timeout_s: float,
    out: str,
    as_json: bool,
    **sizes: Any,
) -> None:
    """The interactive tail: a steady interactive stream alone, then beside a flood and a
    batch, per arm; TTFT and inter-token p50/p95/p99, batch completion, engine steps."""
    keys = [k.strip() for k in arms.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ARMS]
    if unknown or not keys:
        raise click.UsageError(f"unknown arm(s) {unknown or arms!r}; choose from {','.join(ARMS)}")
    tail = sized(engine, sizes)
    choice = _choice(engine, profile, engine_batch or ENGINE_BATCH[engine], vllm_home)
    result = run(keys, tail, choice, arm_timeout_s)
    text = render(result)
    save(out, "tenants", result, text)
    click.echo(json.dumps(result, indent=2) if as_json else text)


def sized(engine: str, flags: dict[str, Any]) -> TailSizes:
    """The engine's preset with every size flag that was given."""
    given = {k: v for k, v in flags.items() if v is not None}
    if "rate" in given:
        given["rate_per_s"] = given.pop("rate")
    return dataclasses.replace(PRESETS["h100" if engine == "sim" else "tiny"], **given)


def _choice(engine: str, profile: str, batch: int, home: str | None) -> EngineChoice:
    if engine == "sim":
        return EngineChoice("sim", SIM_MODEL, None, profile=profile, batch=batch)
    path = vllm_home(home)
    try:
        prepare_vllm(path)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    return EngineChoice("vllm", VLLM_MODEL, VLLM_CONTEXT, pinning=True, vllm_home=path, batch=batch)


def run(
    keys: list[str], sizes: TailSizes, choice: EngineChoice, deadline_s: float
) -> dict[str, Any]:
    """Every arm in turn; the figures, the verdict and what they were measured on."""
    arms = {}
    for key in keys:
        click.echo(f"tenants: ({key}) {ARMS[key].title}: running", err=True)
        arms[key] = run_arm(ARMS[key], sizes, choice, deadline_s)
        click.echo(f"tenants: ({key}) {arms[key]['status']}", err=True)
    return {
        "scenario": "interactive tail",
        "sizes": dataclasses.asdict(sizes),
        "engine": choice.label,
        "engine_note": choice.note,
        "machine": machine(),
        "arms": arms,
        "verdict": verdict(arms),
    }
