"""The newcomer targets (simulator), per scenario, for arm (c) and (d).

- seed: (c) light TTFT p95 <= 2 engine steps; (c) output tok/s >= 95% of (a);
- long: (c) light TTFT p95 <= 3 engine steps; (c) output tok/s >= 95% of (a);
- mixed: no light user's TTFT p95 above 3 engine steps in (c); with token_fair (d),
  each heavy user's share of output tokens within 10% of its weight's share while
  all heavy users are backlogged.

A check involving an arm that FAILED does not hold, whatever its figures; one
whose arm was not run or is not available is not evaluated (``holds`` None). A p95
check also says over how many requests it was read (``samples``): over fewer than 21 a
p95 (linear interpolation) lies between the two largest, so it moves with one request.
Plain values in, plain values out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

TOK_S_SHARE_OF_A = 0.95
LIGHT_STEPS = {"seed": 2.0, "long": 3.0, "mixed": 3.0}
SHARE_OFF = 0.10
OK, FAILED, NOT_AVAILABLE = "ok", "FAILED", "not available"

Arms = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Check:
    label: str
    arms: tuple[str, ...]
    value: Callable[[Arms], float | None]
    bound: float
    at_most: bool  # True: value <= bound; False: value >= bound
    samples: Callable[[Arms], int | None] | None = None  # the requests a percentile is of


def _c_p95_steps(arms: Arms) -> float | None:
    value = arms["c"]["light_ttft_steps"]["p95"]
    return None if value is None else float(value)


def _c_light_measured(arms: Arms) -> int | None:
    value = arms["c"]["light_ttft_ms"].get("measured")
    return None if value is None else int(value)


def _c_tok_s_share(arms: Arms) -> float | None:
    value = arms["c"].get("tok_s_share_of_a")
    return None if value is None else float(value)


def _c_worst_light_user(arms: Arms) -> float | None:
    steps = [u["p95_steps"] for u in arms["c"]["light_by_user"].values()]
    return None if not steps or None in steps else float(max(steps))


def _d_max_share_off(arms: Arms) -> float | None:
    value = arms["d"].get("shares", {}).get("max_off")
    return None if value is None else float(value)


def checks_for(scenario: str) -> dict[str, Check]:
    steps = LIGHT_STEPS[scenario]
    if scenario == "mixed":
        return {
            "c_light_users_p95_steps": Check(
                f"(c) every light user's TTFT p95 <= {steps:g} engine steps", ("c",),
                _c_worst_light_user, steps, at_most=True,
            ),
            "d_heavy_shares_within_10pct": Check(
                "(d) token_fair: each heavy user's token share within 10% of its weight's share",
                ("d",), _d_max_share_off, SHARE_OFF, at_most=True,
            ),
        }  # fmt: skip
    return {
        "c_light_p95_steps": Check(
            f"(c) light TTFT p95 <= {steps:g} engine steps", ("c",), _c_p95_steps, steps,
            at_most=True, samples=_c_light_measured,
        ),
        "c_tok_s_vs_a": Check(
            f"(c) output tok/s >= {TOK_S_SHARE_OF_A:.0%} of (a)", ("a", "c"), _c_tok_s_share,
            TOK_S_SHARE_OF_A, at_most=False,
        ),
    }  # fmt: skip


def evaluate(check: Check, arms: Arms) -> dict[str, Any]:
    out: dict[str, Any] = {"label": check.label, "value": None, "bound": check.bound}
    for key in check.arms:
        status = arms[key].get("status") if key in arms else None
        if status == FAILED:
            return out | {"holds": False, "why": f"arm ({key}) FAILED"}
        if status != OK:
            why = "was not run" if status is None else "is not available"
            return out | {"holds": None, "why": f"arm ({key}) {why}"}
    value = check.value(arms)
    if value is None:
        return out | {"holds": False, "why": "no value was measured"}
    holds = value <= check.bound if check.at_most else value >= check.bound
    out |= {"value": value, "holds": holds, "why": None}
    return out | ({"samples": check.samples(arms)} if check.samples else {})


def criteria(scenario: str, arms: Arms) -> dict[str, Any]:
    out: dict[str, Any] = {k: evaluate(c, arms) for k, c in checks_for(scenario).items()}
    out["all_hold"] = all(c["holds"] is True for c in out.values())
    return out


# Below this many requests a p95 (linear interpolation) lies between the two largest.
FEW_FOR_P95 = 21


def verdict(check: Mapping[str, Any]) -> str:
    if check["holds"] is None:
        return f"not evaluated: {check['why']}"
    if check["why"] is not None:
        return f"does not hold: {check['why']}"
    said = "holds" if check["holds"] else "MISSED"
    samples = check.get("samples")
    if samples is not None and samples < FEW_FOR_P95:
        said += f"; over {samples} requests, between the two largest"
    return said
