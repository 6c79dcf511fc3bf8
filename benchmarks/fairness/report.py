"""The fairness benchmark's figures: one summary per arm, the tables, the Done-when.

Everything here is plain values in, plain values out: an arm's load, engine trace
and CPU become a JSON-ready dict; the run's dict becomes markdown. Latencies are
given in milliseconds and in engine steps: the engine's own mean time per output
token during the flood (``benchmarks.lib.engine_watch.step_ms``), so that figures compare
across engines whose steps differ by orders of magnitude.

An arm with any failed request (an error, a cut answer, or one still open at the
deadline) has the status FAILED: its table row says how many and the first error
instead of figures, and every check involving it does not hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.fairness import stages
from benchmarks.fairness.checks import FAILED, OK, verdict
from benchmarks.fairness.scenarios import user_name
from benchmarks.lib.engine_watch import (
    Sample,
    backlogged_work,
    engine_work,
    preemptions,
    step_ms,
    tpot_ms,
)
from benchmarks.lib.load import LoadResult, RequestResult
from benchmarks.lib.stats import markdown_table, median, pct


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _steps(ms: float | None, step: float | None) -> float | None:
    return None if ms is None or not step else ms / step


def _ttfts_ms(requests: Sequence[RequestResult]) -> list[float]:
    return [r.ttft_s * 1000 for r in requests if r.ttft_s is not None]


def light_summary(load: LoadResult) -> dict[str, Any]:
    ttfts = _ttfts_ms(load.light)
    return {
        "p50": median(ttfts) if ttfts else None,
        "p95": pct(ttfts, 95) if ttfts else None,
        "max": max(ttfts, default=None),
        "measured": len(ttfts),
        "sent": len(load.light),
    }


def in_steps(ttft_ms: Mapping[str, Any], step: float | None) -> dict[str, float | None]:
    return {k: _steps(ttft_ms[k], step) for k in ("p50", "p95", "max")}


def light_by_user(load: LoadResult, step: float | None) -> dict[str, dict[str, float | None]]:
    """Each light user's TTFT p95, in ms and in steps (None: no first token)."""
    out = {}
    for user in dict.fromkeys(r.user for r in load.light):
        mine = [r for r in load.light if r.user == user]
        ttfts = _ttfts_ms(mine)
        p95 = pct(ttfts, 95) if len(ttfts) == len(mine) else None
        out[user] = {"p95_ms": p95, "p95_steps": _steps(p95, step)}
    return out


def failure(load: LoadResult) -> dict[str, Any] | None:
    """How many requests failed and the first error (None: none failed)."""
    failed = load.failed
    if not failed:
        return None
    first = f"stopped: {load.stopped}" if load.stopped else failed[0].error
    return {"count": len(failed), "of": len(load.requests), "first_error": first}


def _broken(preempted: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Resumed answers that were not whole, as a failure (None: none)."""
    if not preempted or not preempted["broken"]:
        return None
    first = f"a resumed answer was not whole: {preempted['first_broken']}"
    return {"count": preempted["broken"], "of": preempted["mid_answer"], "first_error": first}


def engine_summary(
    samples: Sequence[Sample],
    until_s: float | None,
    tpot_ceiling_ms: float,
    failures: int,
    drained_s: float | None = None,
) -> dict[str, Any]:
    """Queue, batch and step over the flood (t=0 to ``until_s``); the work done while the
    flood was backlogged (until ``drained_s``: ``backlogged_work``)."""
    tpots = tpot_ms(samples)
    end = until_s or 0.0
    during = [(s, t) for s, t in zip(samples, tpots, strict=True) if 0 <= s.t_s <= end]
    running = [s.running for s, _ in during]
    measured = [t for _, t in during if t is not None]
    return {
        "step_ms": step_ms(samples, 0.0, end),
        "preemptions": preemptions(samples),
        "work": engine_work(samples),
        "backlogged": None if drained_s is None else backlogged_work(samples, drained_s),
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


def _light_rows(load: LoadResult) -> list[dict[str, Any]]:
    return [
        {
            "user": r.user,
            "arrival_s": round(r.arrival_s, 3),
            "ttft_ms": _ms(r.ttft_s),
            "output_tokens": r.output_tokens,
            "error": r.error,
        }
        for r in load.light
    ]


def arm_summary(
    load: LoadResult,
    idle_path_s: float | None,
    engine: Mapping[str, Any],
    cpu: Mapping[str, Any],
    heavy_shares: Mapping[str, Any] | None = None,
    *,
    fairq_preemptions: Mapping[str, Any] | None = None,
    light_stages: Sequence[dict[str, Any]] | None = None,
    flood_stages: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``fairq_preemptions``: ``resumed.fairq_preemptions`` (fairq arms); an
    answer it resumed that did not come out whole fails the arm. ``light_stages``,
    ``flood_stages``: each light and each flood job's stages inside fairq
    (``stages``; fairq arms)."""
    step = engine["step_ms"]
    light = light_summary(load)
    fairq_s = cpu.get("fairq_s")
    failed = failure(load) or _broken(fairq_preemptions)
    return {
        "status": FAILED if failed else OK,
        "failed": failed,
        "idle_path_ttft_ms": _ms(idle_path_s),
        "step_ms": step,
        "light_ttft_ms": light,
        "light_ttft_steps": in_steps(light, step),
        "light_by_user": light_by_user(load, step),
        "light": _light_rows(load),
        "power_done_s": load.heavy_done_s,
        "heavy_ok": sum(1 for r in load.requests if r.heavy and r.error is None),
        "heavy_sent": sum(1 for r in load.requests if r.heavy),
        "output_tokens": load.output_tokens,
        "wall_s": load.wall_s,
        "output_tok_s": load.output_tok_s,
        "preemptions": engine["preemptions"],
        "fairq_preemptions": dict(fairq_preemptions) if fairq_preemptions else None,
        "light_stages": (
            stages.summary(light_stages, _ttfts_ms(load.light)) if light_stages else None
        ),
        "light_stages_by_job": list(light_stages) if light_stages else None,
        "flood_stages": stages.flood_summary(flood_stages) if flood_stages else None,
        "cpu": dict(cpu),
        "fairq_cpu_ms_per_1k_tokens": (
            fairq_s * 1e6 / load.output_tokens if fairq_s and load.output_tokens else None
        ),
        "shares": dict(heavy_shares) if heavy_shares is not None else None,
        "errors": list(dict.fromkeys(r.error for r in load.failed if r.error))[:5],
        "engine": dict(engine),
    }


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or bottom <= 0 or math.isnan(top) or math.isnan(bottom):
        return None
    return top / bottom


def compare(arms: Mapping[str, dict[str, Any]]) -> None:
    """Add each arm's tokens/s against arm (a), in place (only when (a) ran without failure)."""
    base = arms.get("a", {})
    base_tok_s = base.get("output_tok_s") if base.get("status") == OK else None
    for arm in arms.values():
        if arm.get("status") == OK:
            arm["tok_s_share_of_a"] = _ratio(arm["output_tok_s"], base_tok_s)


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _triple(values: Mapping[str, Any], fmt: str) -> str:
    return " / ".join(_cell(values[k], fmt) for k in ("p50", "p95", "max"))


HEADER = (
    "arm", "light TTFT p50 / p95 / max ms", "in engine steps", "step ms", "power user done s",
    "output tok/s", "tok/s vs (a)", "engine preemptions", "fairq took back (mid-answer)",
    "fairq CPU s", "engine CPU s", "client CPU s", "peak engine waiting",
)  # fmt: skip


def _row(key: str, arm: Mapping[str, Any]) -> list[object]:
    title = f"({key}) {arm['title']}"
    blank = [""] * (len(HEADER) - 2)
    if arm["status"] != OK:
        return [title, _status(arm), *blank]
    share, cpu = arm.get("tok_s_share_of_a"), arm["cpu"]
    return [
        title,
        _triple(arm["light_ttft_ms"], ".0f"),
        _triple(arm["light_ttft_steps"], ".1f"),
        _cell(arm["step_ms"], ".2f"),
        _cell(arm["power_done_s"], ".1f"),
        _cell(arm["output_tok_s"], ".0f"),
        "-" if share is None else f"{share:.0%}",
        _cell(arm["preemptions"], ".0f"),
        _taken_back(arm.get("fairq_preemptions")),
        _cell(cpu.get("fairq_s"), ".1f"),
        _cell(cpu.get("engine_s"), ".1f"),
        _cell(cpu.get("client_s"), ".1f"),
        _cell(arm["engine"]["peak_waiting"], ".0f"),
    ]


def _taken_back(preempted: Mapping[str, Any] | None) -> str:
    if not preempted:
        return "-"
    return f"{preempted['taken_back']} ({preempted['mid_answer']})"


def _status(arm: Mapping[str, Any]) -> str:
    if arm["status"] != FAILED:
        return f"not available: {arm['reason']}"
    failed = arm["failed"]
    error = str(failed["first_error"]).replace("|", "/").replace("\n", " ")[:200]
    if failed.get("count") is None:
        return f"FAILED: {error}"
    return f"FAILED: {failed['count']} of {failed['of']} requests failed; first: {error}"


def _shares_table(arms: Mapping[str, Any], users: Mapping[str, float]) -> str:
    columns = [f"{u} (weight {w:g}): tokens / weight share" for u, w in users.items()]
    header = ["arm", "window s", *columns]
    rows = []
    for key, arm in arms.items():
        shares = arm.get("shares") if arm["status"] == OK else None
        if not shares or shares["window_s"] is None:
            rows.append([f"({key}) {arm['title']}", "-", *["-"] * len(users)])
            continue
        start, end = shares["window_s"]
        cells = [_share_cell(shares["users"][u]) for u in users]
        rows.append([f"({key}) {arm['title']}", f"{start:.1f}-{end:.1f}", *cells])
    return markdown_table(header, rows)


def _share_cell(user: Mapping[str, Any]) -> str:
    share = "-" if user["share"] is None else f"{user['share']:.0%}"
    return f"{share} / {user['weight_share']:.0%}"


def _scenario_line(s: Mapping[str, Any]) -> str:
    low, high = s["output_tokens"]
    sizes = f"{low}" if low == high else f"{low}-{high} (uniform)"
    weights = ", ".join(f"{w:g}" for w in s["heavy_weights"])
    who = "user A" if len(s["heavy_weights"]) == 1 else f"heavy users of weights {weights}"
    mode = "streamed" if s["power_stream"] else "not streamed"
    arrivals = "Poisson arrivals, mean gap" if s["name"] == "mixed" else "B and C first, then every"
    return (
        f"{who}: {s['power_requests']} requests each at t=0 (~{s['prompt_tokens']} prompt, "
        f"{sizes} output tokens, {mode}); {s['light_users']} light users send "
        f"{s['light_requests']} streamed request(s) each ({s['light_output_tokens']} tokens) "
        f"from t={s['light_start_s']:g}s, {arrivals} {s['light_interval_s']:g}s."
    )


def _section(name: str, section: Mapping[str, Any]) -> list[str]:
    arms, s = section["arms"], section["scenario"]
    lines = [
        f"## Scenario {name}",
        "",
        _scenario_line(s),
        f"Light-user TTFT on the idle engine (median, direct): "
        f"{_cell(section['idle_ttft_ms'], '.1f')} ms. An engine step is the engine's mean "
        "time per output token during the flood, per arm.",
        "",
        markdown_table(HEADER, [_row(k, a) for k, a in arms.items()]),
        "",
    ]
    if name == "mixed":
        users = {user_name(i): w for i, w in enumerate(s["heavy_weights"])}
        lines += ["Heavy users' share of output tokens while all are backlogged:", "",
                  _shares_table(arms, users), ""]  # fmt: skip
    return (
        lines + _work_lines(arms) + _stage_lines(arms) + _flood_stage_lines(arms)
        + _criteria_lines(section["criteria"])
    )  # fmt: skip


def _work_lines(arms: Mapping[str, Any]) -> list[str]:
    """What each arm's engine computed: a smaller batch takes more steps for the same
    tokens (each step has a fixed cost), and a prompt prefilled twice is work redone."""
    rows: list[list[object]] = []
    for key, arm in arms.items():
        engine = arm.get("engine") or {}
        work = engine.get("work")
        if work:
            backlogged = engine.get("backlogged") or {}
            rows.append([f"({key}) {arm['title']}", _cell(work["steps"], ".0f"),
                         _cell(backlogged.get("tokens_per_step"), ".2f"),
                         _cell(work["prefill_tokens"], ".0f"),
                         _cell(engine.get("mean_running"), ".0f"), _overrun(work)])  # fmt: skip
    header = ["arm", "engine steps", "output tokens per step while the flood is backlogged",
              "prompt tokens prefilled", "mean running",
              "simulator's timeline lost, s of modeled s"]  # fmt: skip
    return _titled_table("What the engine computed (from its step histogram):", header, rows)


def _overrun(work: Mapping[str, Any]) -> str:
    """The time the simulator's step timeline lost while busy, against its steps' modeled
    time ('-': an engine)."""
    lost, modeled = work.get("sim_overrun_s"), work.get("sim_modeled_s")
    if lost is None or not modeled:
        return "-"
    return f"{lost:.2f} of {modeled:.1f} ({lost / modeled:.1%})"


def _stage_lines(arms: Mapping[str, Any]) -> list[str]:
    """Where fairq arms' light requests spent their TTFT (``stages``)."""
    rows: list[list[object]] = []
    for key, arm in arms.items():
        found = arm.get("light_stages") if arm["status"] == OK else None
        if found:
            cells = [f"{_cell(found[s]['p50'], '.1f')} / {_cell(found[s]['max'], '.1f')}"
                     for s in stages.STAGES]  # fmt: skip
            rows.append([f"({key}) {arm['title']}", *cells,
                         _cell(found["gateway"]["p50"], ".1f")])  # fmt: skip
    header = ["arm", "in fairq's queue p50 / max ms", "to a worker", "at the engine",
              "gateway and client (p50)"]  # fmt: skip
    return _titled_table("Where a light request's TTFT goes (fairq arms):", header, rows)


def _flood_stage_lines(arms: Mapping[str, Any]) -> list[str]:
    """How fast fairq arms sent the flood's requests and how long each took to start."""
    rows = [
        _flood_row(key, arm, arm["flood_stages"])
        for key, arm in arms.items()
        if arm["status"] == OK and arm.get("flood_stages")
    ]
    header = ["arm", "sent a second", "per engine step", "to a worker p50 / max ms",
              "at the engine p50 / max ms", "at the engine p50, steps"]  # fmt: skip
    return _titled_table(
        "The flood's requests once sent (fairq arms; most are refills of a freed slot):",
        header,
        rows,
    )


def _flood_row(key: str, arm: Mapping[str, Any], found: Mapping[str, Any]) -> list[object]:
    step, per_s, engine = arm["step_ms"], found["sent_per_s"], found["engine"]
    per_step = per_s * step / 1000 if step and per_s else None
    return [
        f"({key}) {arm['title']}",
        _cell(per_s, ".1f"),
        _cell(per_step, ".2f"),
        f"{_cell(found['hand_over']['p50'], '.1f')} / {_cell(found['hand_over']['max'], '.1f')}",
        f"{_cell(engine['p50'], '.1f')} / {_cell(engine['max'], '.1f')}",
        _cell(engine["p50"] / step if step else None, ".1f"),
    ]


def _titled_table(title: str, header: list[str], rows: list[list[object]]) -> list[str]:
    """A title, a blank line, the table and a blank line; nothing without rows."""
    return [title, "", markdown_table(header, rows), ""] if rows else []


def _criteria_lines(checks: Mapping[str, Any]) -> list[str]:
    lines = ["Done-when:"]
    for key, check in checks.items():
        if key == "all_hold":
            continue
        lines.append(f"- {check['label']}: {_cell(check['value'], '.2f')} ({verdict(check)})")
    return lines


def render(result: Mapping[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# fairq fairness benchmark, {result['date']}",
        "",
        f"Engine: {result['engine']}. Machine: {m['cores']} cores, {m['platform']}, "
        f"Python {m['python']}. CPU pinning: {result['cpu_pinning']}.",
        "",
    ]
    for name, section in result["scenarios"].items():
        lines += [*_section(name, section), ""]
    if result["failed_arms"]:
        lines.append(f"FAILED arms: {', '.join(result['failed_arms'])}.")
    lines.append(result["engine_note"])
    return "\n".join(lines)
