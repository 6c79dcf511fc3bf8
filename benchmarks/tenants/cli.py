"""``fairq bench tenants``: the interactive tail, its arms side by side, on the simulator."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from benchmarks._fairness_provision import SIM_MODEL, EngineChoice
from benchmarks.stats import machine, save
from benchmarks.tenants.plan import TailSizes
from benchmarks.tenants.report import render, verdict
from benchmarks.tenants.run import ARMS, run_arm
from fairq.runtime import environment

ENGINE_BATCH = 32  # the simulator's max_num_seqs: what the default sizes half load
_DEFAULTS = TailSizes()


@click.command("tenants", epilog=environment())
@click.option("--arms", default="a,e,c", show_default=True, help=f"of {','.join(ARMS)}")
@click.option("--profile", default="h100-8b", show_default=True, help="simulator profile")
@click.option(
    "--engine-batch",
    default=ENGINE_BATCH,
    show_default=True,
    type=click.IntRange(1),
    help="the simulator's max_num_seqs",
)
@click.option("--interactive-requests", default=_DEFAULTS.interactive_requests, show_default=True)
@click.option(
    "--rate",
    default=_DEFAULTS.rate_per_s,
    show_default=True,
    help="interactive requests per second (Poisson)",
)
@click.option("--interactive-users", default=_DEFAULTS.interactive_users, show_default=True)
@click.option("--prompt-tokens", default=_DEFAULTS.prompt_tokens, show_default=True)
@click.option(
    "--output-tokens",
    default=_DEFAULTS.output_tokens,
    show_default=True,
    help="per interactive answer",
)
@click.option("--power-requests", default=_DEFAULTS.power_requests, show_default=True)
@click.option("--power-output-tokens", default=_DEFAULTS.power_output_tokens, show_default=True)
@click.option("--batch-lines", default=_DEFAULTS.batch_lines, show_default=True)
@click.option("--batch-output-tokens", default=_DEFAULTS.batch_output_tokens, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--arm-timeout-s", default=900.0, show_default=True, help="per phase")
@click.option("--out", default="bench-out/tenants", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def main(
    *,
    arms: str,
    profile: str,
    engine_batch: int,
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
    tail = TailSizes(rate_per_s=sizes.pop("rate"), **sizes)
    choice = EngineChoice("sim", SIM_MODEL, None, profile=profile, batch=engine_batch)
    result = run(keys, tail, choice, arm_timeout_s)
    text = render(result)
    save(out, "tenants", result, text)
    click.echo(json.dumps(result, indent=2) if as_json else text)


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
