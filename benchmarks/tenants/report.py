"""The interactive tail's verdict and table (pure, no I/O).

The verdict is issue-sized: fairq's interactive TTFT p99 under the flood within
``TTFT_P99_RATIO`` of its own no-flood baseline and its inter-token p99 within
``ITL_P99_RATIO``, every batch line answered, and the engine's steps for the flood
phase's work within ``STEPS_OF_FIFO`` of straight FIFO's. An arm that failed holds
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TTFT_P99_RATIO = 1.2
ITL_P99_RATIO = 1.1
STEPS_OF_FIFO = 1.03


def ratio(arm: Mapping[str, Any], figure: str) -> float | None:
    """The arm's interactive ``figure`` ("ttft_ms" or "itl_ms") p99 under the flood over
    its own p99 alone (None: either is missing)."""
    alone, flooded = arm["alone"][figure]["p99"], arm["flooded"][figure]["p99"]
    if alone is None or flooded is None or alone <= 0:
        return None
    return float(flooded / alone)


def steps_of_fifo(arm: Mapping[str, Any], fifo: Mapping[str, Any] | None) -> float | None:
    """The arm's engine steps for the flood phase over straight FIFO's (the same work:
    every arm answers the same plan)."""
    if fifo is None or fifo.get("status") != "ok":
        return None
    steps, fifo_steps = _steps(arm), _steps(fifo)
    return steps / fifo_steps if steps and fifo_steps else None


def _steps(arm: Mapping[str, Any]) -> float | None:
    work = arm.get("engine") or {}
    value = work.get("steps")
    return None if value is None else float(value)


def verdict(arms: Mapping[str, Mapping[str, Any]], key: str = "c") -> dict[str, Any]:
    """Whether arm ``key`` (fairq's defaults) holds the interactive tail's bounds."""
    arm = arms.get(key)
    if arm is None:
        return {"holds": None, "why": f"arm ({key}) did not run"}
    if arm["status"] != "ok":
        return {"holds": False, "why": f"arm ({key}) failed: {arm['first_error']}"}
    ttft, itl, steps = (
        ratio(arm, "ttft_ms"),
        ratio(arm, "itl_ms"),
        steps_of_fifo(arm, arms.get("a")),
    )
    batch = arm["batch"]
    figures = {
        "ttft_p99_ratio": ttft,
        "itl_p99_ratio": itl,
        "steps_of_fifo": steps,
        "batch_done": batch["completed"] == batch["lines"],
    }
    if ttft is None or itl is None or steps is None:
        return {"holds": None, "why": "a figure is missing", **figures}
    holds = (
        ttft <= TTFT_P99_RATIO
        and itl <= ITL_P99_RATIO
        and steps <= STEPS_OF_FIFO
        and figures["batch_done"]
    )
    return {"holds": holds, "why": None, **figures}


def render(result: Mapping[str, Any]) -> str:
    """The run's table: every arm's interactive class alone and under the flood."""
    arms = result["arms"]
    header = (
        "| arm | interactive TTFT p50 / p95 / p99 ms, alone | under the flood | p99 ratio "
        "| ITL p99 ms alone / flood | ratio | power TTFT p50 ms | batch lines done "
        "| engine steps vs (a) | status |"
    )
    lines = [
        "# fairq tenants: the interactive tail",
        "",
        result["engine_note"],
        "",
        f"Machine: {result['machine']['cores']} cores. Sizes: {_sizes(result['sizes'])}.",
        "",
        header,
        "|" + "---|" * 10,
    ]
    for key, arm in arms.items():
        lines.append(_row(key, arm, arms.get("a")))
    v = result["verdict"]
    lines += [
        "",
        f"Holds (arm c): {_holds(v)}. Bounds: TTFT p99 <= {TTFT_P99_RATIO}x and "
        f"ITL p99 <= {ITL_P99_RATIO}x its own no-flood baseline, every batch line done, "
        f"engine steps <= {STEPS_OF_FIFO:.0%} of (a)'s.",
    ]
    return "\n".join(lines)


def _row(key: str, arm: Mapping[str, Any], fifo: Mapping[str, Any] | None) -> str:
    alone, flooded = arm["alone"], arm["flooded"]
    batch = arm["batch"]
    status = arm["status"] if arm["status"] == "ok" else f"**FAILED**: {arm['failed']} requests"
    cells = [
        f"({key}) {arm['title']}",
        _pcts(alone["ttft_ms"]),
        _pcts(flooded["ttft_ms"]),
        _num(ratio(arm, "ttft_ms"), ".2f", "x"),
        f"{_num(alone['itl_ms']['p99'], '.1f')} / {_num(flooded['itl_ms']['p99'], '.1f')}",
        _num(ratio(arm, "itl_ms"), ".2f", "x"),
        _num(arm["power_ttft_ms"]["p50"], ".0f"),
        f"{batch['completed']} / {batch['lines']} ({batch['via']})",
        _num(steps_of_fifo(arm, fifo), ".1%"),
        status,
    ]
    return "| " + " | ".join(cells) + " |"


def _pcts(lat: Mapping[str, Any]) -> str:
    return " / ".join(_num(lat[p], ".0f") for p in ("p50", "p95", "p99"))


def _num(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _holds(v: Mapping[str, Any]) -> str:
    if v["holds"] is None:
        return f"not judged ({v['why']})"
    return "yes" if v["holds"] else "**no**" + (f" ({v['why']})" if v["why"] else "")


def _sizes(sizes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sizes.items())
