"""The fairness benchmark's figures: one summary per arm, the table, the Done-when check.

Everything here is plain values in, plain values out: an arm's load and engine
trace become a JSON-ready dict; the run's dict becomes markdown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks._fairness_engine import Sample, tpot_ms
from benchmarks._fairness_load import LoadResult
from benchmarks.stats import markdown_table, median, pct

# The Done-when of the issue: arm (c) against arm (a) and the idle engine.
P95_LOWER_THAN_A = 20.0
P95_OVER_IDLE = 2.0
TOK_S_SHARE_OF_A = 0.9
NOTE = (
    "Simulator figures are estimates: the simulator models an engine's batching and "
    "queueing from a profile; it is not a GPU."
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def light_summary(load: LoadResult) -> dict[str, Any]:
    ttfts = [r.ttft_s * 1000 for r in load.light if r.ttft_s is not None]
    return {
        "p50": median(ttfts) if ttfts else None,
        "p95": pct(ttfts, 95) if ttfts else None,
        "max": max(ttfts, default=None),
        "measured": len(ttfts),
        "sent": len(load.light),
    }


def engine_summary(
    samples: Sequence[Sample], until_s: float | None, tpot_ceiling_ms: float, failures: int
) -> dict[str, Any]:
    """Queue and batch over the arm; the TPOT share is what fairq's ceiling would see."""
    tpots = tpot_ms(samples)
    during = [(s, t) for s, t in zip(samples, tpots, strict=True) if 0 <= s.t_s <= (until_s or 0)]
    running = [s.running for s, _ in during]
    measured = [t for _, t in during if t is not None]
    return {
        "peak_waiting": max((s.waiting for s in samples), default=None),
        "peak_running": max((s.running for s in samples), default=None),
        "mean_running": sum(running) / len(running) if running else None,
        "tpot_ms_p50": median(measured) if measured else None,
        "tpot_over_ceiling_share": (
            sum(1 for t in measured if t > tpot_ceiling_ms) / len(measured) if measured else None
        ),
        "scrape_failures": failures,
        "trace": {
            "t_s": [round(s.t_s, 3) for s in samples],
            "waiting": [s.waiting for s in samples],
            "running": [s.running for s in samples],
            "tpot_ms": [None if t is None else round(t, 2) for t in tpots],
        },
    }


def arm_summary(
    load: LoadResult, idle_path_s: float | None, engine: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "available": True,
        "idle_path_ttft_ms": _ms(idle_path_s),
        "light_ttft_ms": light_summary(load),
        "light": [
            {
                "user": r.user,
                "arrival_s": round(r.arrival_s, 3),
                "ttft_ms": _ms(r.ttft_s),
                "output_tokens": r.output_tokens,
                "error": r.error,
            }
            for r in load.light
        ],
        "power_done_s": load.power_done_s,
        "power_ok": load.power_ok,
        "power_errors": load.power_errors,
        "output_tokens": load.output_tokens,
        "wall_s": load.wall_s,
        "output_tok_s": load.output_tok_s,
        "errors": load.errors,
        "engine": dict(engine),
    }


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or bottom <= 0 or math.isnan(top) or math.isnan(bottom):
        return None
    return top / bottom


def compare(arms: Mapping[str, dict[str, Any]], idle_ms: float | None) -> None:
    """Add each arm's ratios against arm (a) and the idle engine, in place."""
    base = arms.get("a", {})
    base_p95 = base.get("light_ttft_ms", {}).get("p95")
    for arm in arms.values():
        if not arm.get("available"):
            continue
        p95 = arm["light_ttft_ms"]["p95"]
        arm["p95_times_lower_than_a"] = _ratio(base_p95, p95)
        arm["p95_over_idle"] = _ratio(p95, idle_ms)
        arm["tok_s_share_of_a"] = _ratio(arm["output_tok_s"], base.get("output_tok_s"))


def criteria(arms: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The Done-when, for arm (c); None where (a) or (c) did not run."""
    c = arms.get("c", {})
    if not (c.get("available") and arms.get("a", {}).get("available")):
        return {"evaluated": False, "why": "needs arms (a) and (c)"}
    checks = {
        "p95_at_least_20x_lower_than_a": (c["p95_times_lower_than_a"], P95_LOWER_THAN_A, "ge"),
        "p95_within_2x_idle": (c["p95_over_idle"], P95_OVER_IDLE, "le"),
        "tok_s_at_least_90pct_of_a": (c["tok_s_share_of_a"], TOK_S_SHARE_OF_A, "ge"),
    }
    out: dict[str, Any] = {"evaluated": True}
    for name, (value, bound, op) in checks.items():
        holds = value is not None and (value >= bound if op == "ge" else value <= bound)
        out[name] = {"value": value, "bound": bound, "holds": holds}
    out["all_hold"] = all(v["holds"] for k, v in out.items() if isinstance(v, dict))
    return out


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _row(key: str, arm: Mapping[str, Any]) -> list[object]:
    title = f"({key}) {arm['title']}"
    if not arm.get("available"):
        return [title, f"not available: {arm['reason']}", *[""] * 9]
    t, e = arm["light_ttft_ms"], arm["engine"]
    share = arm.get("tok_s_share_of_a")
    return [
        title,
        _cell(t["p50"], ".0f"),
        _cell(t["p95"], ".0f"),
        _cell(t["max"], ".0f"),
        _cell(arm.get("p95_times_lower_than_a"), ".1f") + "x",
        _cell(arm.get("p95_over_idle"), ".1f") + "x",
        _cell(arm["power_done_s"], ".1f"),
        _cell(arm["output_tok_s"], ".0f"),
        "-" if share is None else f"{share:.0%}",
        _cell(e["peak_waiting"], ".0f"),
        f"{arm['power_errors'] + t['sent'] - t['measured']}",
    ]


HEADER = (
    "arm", "light TTFT p50 ms", "p95 ms", "max ms", "p95 lower than (a)", "p95 / idle",
    "power user done s", "output tok/s", "tok/s vs (a)", "peak engine waiting", "errors",
)  # fmt: skip


def render(result: Mapping[str, Any]) -> str:
    arms = result["arms"]
    table = markdown_table(HEADER, [_row(k, a) for k, a in arms.items()])
    m, s = result["machine"], result["scenario"]
    lines = [
        f"# fairq fairness benchmark, {result['date']}",
        "",
        f"Engine: {result['engine']}. Machine: {m['cores']} cores, {m['platform']}, "
        f"Python {m['python']}.",
        f"Scenario: user A sends {s['power_requests']} requests at t=0 "
        f"(~{s['prompt_tokens']} prompt, {s['output_tokens']} output tokens); "
        f"{s['light_users']} light users send one streamed request each "
        f"({s['light_output_tokens']} tokens) from t={s['light_start_s']:g}s, "
        f"every {s['light_interval_s']:g}s after the first two.",
        f"Light-user TTFT on the idle engine (median, direct): "
        f"{_cell(result['idle_ttft_ms'], '.1f')} ms.",
        "",
        table,
        "",
        *_criteria_lines(result["criteria"]),
        "",
        NOTE if result["simulated"] else "Engine: the one at --engine-url, as it was started.",
    ]
    return "\n".join(lines)


def _criteria_lines(checks: Mapping[str, Any]) -> list[str]:
    if not checks.get("evaluated"):
        return [f"Done-when not evaluated: {checks['why']}."]
    names = {
        "p95_at_least_20x_lower_than_a": "(c) light TTFT p95 at least 20x lower than (a)",
        "p95_within_2x_idle": "(c) light TTFT p95 within 2x of the idle engine's",
        "tok_s_at_least_90pct_of_a": "(c) output tok/s at least 90% of (a)",
    }
    lines = ["Done-when (arm c):"]
    for key, label in names.items():
        check = checks[key]
        verdict = "holds" if check["holds"] else "MISSED"
        lines.append(f"- {label}: {_cell(check['value'], '.2f')} ({verdict})")
    return lines
