"""The scenario matrix of ``fairq bench fairness --matrix``: engines of several capacities,
each flood, fairq's defaults side by side with the stack told the engine's batch.

A cell is an engine (the simulator's profile with ``max_num_seqs`` set, or a KV cache so
small that it bounds the running set first). Each cell runs the chosen floods with the
matrix's arms, side by side in one run: (a) straight FIFO, (e) straight with the
engine's priority policy, (c) fairq's defaults (which learn the engine's capacity) and
(t) fairq told the engine's batch (``batch_slots``), the hand-tuned stack. The floods
are sized to the cell's capacity (``sizes``), so each lasts a few waves of its batch
and outlasts its light users.

What holds per cell and flood (``verdict``): fairq's defaults reach the told stack's
light TTFT p95 within ``P95_RATIO`` (or within ``P95_STEPS`` engine steps, whichever
is larger), with engine steps for the same work at most ``STEPS_OF_FIFO`` of FIFO's
while the flood is backlogged: on a 2-core machine wall-clock tokens/s spread by a
fifth; the engine's step count does not. Plain values in, plain values out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

P95_RATIO = 1.25
P95_STEPS = 1.0
STEPS_OF_FIFO = 1.03
MATRIX_ARMS = "a,e,c,t"
# Light users per flood. A p95 of 12 is their largest but one, and about one step in
# eight prefills a refill's prompt, which a newcomer arriving then waits out whatever fairq
# does: whether two of twelve meet one was a coin toss per arm (the told stack's p95 read
# 3.2-9.6 steps over five runs of one cell). Of 24, arriving as densely in the same window,
# about three do in each arm. Each newcomer costs the flood a held step and a take-back,
# so not many more.
LIGHT_USERS = 24
# The KV-bound cell: a KV cache for about this many of the flood's sequences, the batch
# as the profile's (256).
KV_SEQUENCES = 12
_KV_TOKENS_PER_SEQUENCE = 1200  # the seed flood's 1,000-token prompt and 200-token answer


@dataclass(frozen=True)
class Cell:
    name: str
    batch: int  # the engine's max_num_seqs
    kv_tokens: int | None = None  # its KV cache, if not the profile's
    capacity: int = 0  # what bounds its running set (the batch, or the KV cache's share)

    @property
    def runs(self) -> int:
        return self.capacity or self.batch


CELLS = (
    Cell("batch 4", 4),
    Cell("batch 16", 16),
    Cell("batch 64", 64),
    Cell("batch 256", 256),
    Cell(
        f"KV-bound (~{KV_SEQUENCES} sequences)",
        256,
        kv_tokens=KV_SEQUENCES * _KV_TOKENS_PER_SEQUENCE,
        capacity=KV_SEQUENCES,
    ),
)


def parse_cells(text: str) -> list[Cell]:
    """``"4,16,kv"`` -> those cells; ``"all"``: every one."""
    keys = [k.strip().lower() for k in text.split(",") if k.strip()]
    if keys == ["all"]:
        return list(CELLS)
    by_key = {str(c.batch): c for c in CELLS if c.kv_tokens is None} | {"kv": CELLS[-1]}
    unknown = [k for k in keys if k not in by_key]
    if unknown or not keys:
        raise ValueError(
            f"unknown cell(s) {unknown or text!r}; choose from all or {','.join(by_key)}"
        )
    return [by_key[k] for k in dict.fromkeys(keys)]


def sizes(scenario: str, cell: Cell) -> dict[str, Any]:
    """The size flags of ``scenario`` (the h100 presets) in ``cell``: a flood of many waves
    of what the engine runs at once (at most the preset's), and enough light requests
    within it for a p95 (``LIGHT_USERS``, of one request each, two in mixed)."""
    runs = cell.runs
    if scenario == "seed":
        return {
            "power_requests": _within(20 * runs, 24, 500),
            "light_users": LIGHT_USERS,
            "light_interval_s": 0.5,
        }
    if scenario == "long":
        return {
            "power_requests": min(3 * runs + 4, 300),
            "long_output_tokens": "500-1500",
            "light_users": LIGHT_USERS,
            "light_start_s": 5.0 if runs > 64 else 2.0,
            "light_interval_s": 1.0,
        }
    return {
        "power_requests": _within(6 * runs, 8, 300),
        "light_users": LIGHT_USERS,
        "light_interval_s": 0.25,
    }


def _within(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def verdict(arms: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Whether (c) holds against (t) and (a) in one cell's flood (``holds`` None: an arm
    did not run; False where any of them failed). Engine steps for the same work are
    compared while the flood is backlogged (``backlogged_work``: its drain, the last
    answers ending one by one, depends on the order they were served in, not on how
    well the batch was kept full); the whole run's steps are reported beside."""
    needed = ("a", "c", "t")
    if any(arms.get(k, {}).get("status") != "ok" for k in needed):
        failed = any(arms.get(k, {}).get("status") == "FAILED" for k in needed)
        return {"holds": False if failed else None, "why": "an arm did not run or failed"}
    c_p95 = arms["c"]["light_ttft_steps"]["p95"]
    t_p95 = arms["t"]["light_ttft_steps"]["p95"]
    c_rate, a_rate = _tokens_per_step(arms["c"]), _tokens_per_step(arms["a"])
    c_steps, a_steps = _steps(arms["c"]), _steps(arms["a"])
    if c_p95 is None or t_p95 is None or a_rate is None or not c_rate:
        return {"holds": None, "why": "a figure is missing"}
    bound = max(P95_RATIO * t_p95, t_p95 + P95_STEPS)
    share = a_rate / c_rate  # steps (c) takes for (a)'s work in one step
    return {
        "holds": c_p95 <= bound and share <= STEPS_OF_FIFO,
        "c_p95_steps": c_p95,
        "p95_bound_steps": bound,
        "steps_of_fifo": share,
        "whole_run_steps_of_fifo": c_steps / a_steps if c_steps and a_steps else None,
        "why": None,
    }


def _tokens_per_step(arm: Mapping[str, Any]) -> float | None:
    backlogged = arm.get("engine", {}).get("backlogged") or {}
    value = backlogged.get("tokens_per_step")
    return None if value is None else float(value)


def _steps(arm: Mapping[str, Any]) -> float | None:
    work = arm.get("engine", {}).get("work") or {}
    value = work.get("steps")
    return None if value is None else float(value)


def render(result: Mapping[str, Any]) -> str:
    """The matrix as one markdown table, a row per cell and flood."""
    lines = [
        "# fairq fairness matrix",
        "",
        f"{result['engine_note']} Machine: {result['machine']['cores']} cores.",
        "",
        "| cell | flood | (c) defaults light p50 / p95 / max ms | in steps | "
        "(t) told p95 steps | (e) engine priority p50 / max ms | (a) FIFO p50 ms | "
        "(c) engine steps vs (a), backlogged | whole run | (c) fairq CPU s | holds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, scenarios in result["cells"].items():
        for name, section in scenarios.items():
            lines.append(_row(cell, name, section))
    lines += [
        "",
        f"holds: (c)'s light TTFT p95 within {P95_RATIO}x (t)'s or {P95_STEPS:g} engine "
        f"step more, whichever is larger, with engine steps for (a)'s work <= "
        f"{STEPS_OF_FIFO:.0%} of (a)'s while the flood is backlogged (output tokens per "
        "step until at most a batch of it is left); the whole run's steps beside.",
    ]
    return "\n".join(lines)


def _row(cell: str, name: str, section: Mapping[str, Any]) -> str:
    arms = section["arms"]
    judged = section["matrix"]

    def ms(key: str, *stats: str) -> str:
        arm = arms.get(key, {})
        if arm.get("status") != "ok":
            return str(arm.get("status", "-"))
        return " / ".join(_num(arm["light_ttft_ms"][s]) for s in stats)

    def steps(key: str, *stats: str) -> str:
        arm = arms.get(key, {})
        if arm.get("status") != "ok":
            return "-"
        return " / ".join(_num(arm["light_ttft_steps"][s], 1) for s in stats)

    cpu = arms.get("c", {}).get("cpu", {}).get("fairq_s")
    holds = {True: "yes", False: "**no**", None: "-"}[judged["holds"]]
    return (
        f"| {cell} | {name} | {ms('c', 'p50', 'p95', 'max')} | {steps('c', 'p50', 'p95', 'max')} "
        f"| {steps('t', 'p95')} | {ms('e', 'p50', 'max')} | {ms('a', 'p50')} "
        f"| {_share(judged.get('steps_of_fifo'))} "
        f"| {_share(judged.get('whole_run_steps_of_fifo'))} | {_num(cpu, 1)} | {holds} |"
    )


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: Any, digits: int = 0) -> str:
    return "-" if value is None else f"{float(value):.{digits}f}"
