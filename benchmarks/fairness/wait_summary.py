"""The wait benchmark's figures: each first look's estimate against the wait that followed.

A spell (``wait_sampler.Spell``) was looked at once, as soon as the sampler saw it
queued; its actual wait is from that look to its dispatch (what ``estimated_wait_s``
promises: the seconds until it is dispatched, from now). Its estimate is within 2x when
``0.5 <= estimate / actual <= 2``, or when both are at most ``FLOOR_S``: the dispatcher
works in rounds of about 0.2 s, and a wait of a round or two is "now" to a client, where
a ratio of two such small figures (0.1 against 0.3 s) says nothing. A null estimate is a
miss, whatever its reason. Spells the sampler never saw queued (dispatched within a tick)
have no look and are counted apart, with their waits.

Each figure is given over all looks and over the looks made in the spell's first second
(the sampler is one process on a loaded machine: in a flood of hundreds of jobs queued at
once, some first looks come later). The criterion holds for a flood when it ran without
a failed request and at least ``CRITERION`` of its looked-at spells are within 2x, both
over all looks and over those of the first second.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from benchmarks.lib.stats import median, pct

WITHIN = 2.0
FLOOR_S = 0.5
CRITERION = 0.8
FIRST_SECOND_MS = 1000


def within(estimate_s: float | None, actual_s: float) -> bool:
    """The estimate lies within a factor of 2 of the actual wait (or both are tiny)."""
    if estimate_s is None:
        return False
    if estimate_s <= FLOOR_S and actual_s <= FLOOR_S:
        return True
    return actual_s > 0 and 1 / WITHIN <= estimate_s / actual_s <= WITHIN


def actual_s(spell: Mapping[str, Any]) -> float | None:
    """Seconds from the look to the dispatch (None: no look, or not seen dispatched)."""
    if spell["look_ms"] is None or spell["left_ms"] is None:
        return None
    return max(0.0, (int(spell["left_ms"]) - int(spell["look_ms"])) / 1000)


def summary(spells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of one group of spells: over all looks, and over the looks made in the
    spell's first second (``first_second``)."""
    looked = [s for s in spells if s["look_ms"] is not None]
    unseen = [s for s in spells if s["look_ms"] is None]
    ages = [s["look_ms"] - s["queued_ms"] for s in looked]
    early = [s for s, age in zip(looked, ages, strict=True) if age <= FIRST_SECOND_MS]
    waits = [s["left_ms"] - s["queued_ms"] for s in spells if s["left_ms"] is not None]
    return {
        "spells": len(spells),
        "looked": len(looked),
        "not_looked": len(unseen),
        "not_looked_wait_ms_max": max(
            (s["left_ms"] - s["queued_ms"] for s in unseen if s["left_ms"] is not None),
            default=None,
        ),
        "look_age_ms": {"p50": median(ages), "max": max(ages, default=None)},
        "looked_in_first_second": _share(len(early), len(looked)),
        "wait_ms": {"p50": median(waits), "max": max(waits, default=None)},
        **_accuracy(looked),
        "first_second": _accuracy(early),
        "null_reasons": dict(Counter(s["reason"] for s in looked if s["estimate_s"] is None)),
    }


def _accuracy(looked: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How the looks' estimates compare with the waits that followed."""
    measured = [(s, a) for s in looked if (a := actual_s(s)) is not None]
    ratios = [s["estimate_s"] / a for s, a in measured if s["estimate_s"] is not None and a > 0]
    return {
        "looked": len(looked),
        "with_number": _share(sum(s["estimate_s"] is not None for s in looked), len(looked)),
        "measured": len(measured),
        "ratio": {"p10": pct(ratios, 10), "p50": median(ratios), "p90": pct(ratios, 90)},
        "within_2x": _share(sum(within(s["estimate_s"], a) for s, a in measured), len(measured)),
    }


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def flood_figures(
    spells: Sequence[Mapping[str, Any]], light_users: Iterable[str]
) -> dict[str, Any]:
    """A flood's figures: its requests' spells (all, heavy and light users apart) and the
    spells of jobs taken back out of the engine and queued again."""
    light = set(light_users)
    own = [s for s in spells if s["taken_back"] == 0]
    return {
        "requests": summary(own),
        "heavy": summary([s for s in own if s["user"] not in light]),
        "light": summary([s for s in own if s["user"] in light]),
        "taken_back": summary([s for s in spells if s["taken_back"] > 0]),
    }


def holds(flood: Mapping[str, Any]) -> bool:
    if flood["status"] != "ok":
        return False
    figures = flood["figures"]["requests"]
    shares = (figures["within_2x"], figures["first_second"]["within_2x"])
    return all(share is not None and share >= CRITERION for share in shares)


_HEAD = (
    "| flood | status | queued jobs | looked at (in 1st s) | look age p50 / max ms "
    "| a number at first sight | median est/actual (p10-p90) | within 2x | within 2x, "
    "looks in 1st s | nulls | holds |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


def render(result: Mapping[str, Any]) -> str:
    """The Markdown table, a row per flood (and one for its taken-back spells)."""
    rows = [_HEAD]
    for name, flood in result["floods"].items():
        if flood["status"] != "ok" and "figures" not in flood:
            rows.append(f"| {name} | FAILED: {flood['error']} |" + " |" * 9)
            continue
        figures = flood["figures"]
        status = "ok" if flood["status"] == "ok" else f"FAILED: {flood['error']}"
        rows.append(_row(name, status, figures["requests"], "yes" if holds(flood) else "no"))
        if figures["taken_back"]["spells"]:
            rows.append(_row(f"{name}, taken back and queued again", "", figures["taken_back"], ""))
    notes = [
        f"Within 2x: 0.5 <= estimate / actual <= 2, or both <= {FLOOR_S} s; a null is a miss. "
        "The actual wait runs from the look to the dispatch. Queued jobs not looked at were "
        "dispatched before the sampler's next tick.",
        result["note"],
    ]
    return "\n".join(rows) + "\n\n" + "\n".join(notes)


def _row(name: str, status: str, g: Mapping[str, Any], holds_text: str) -> str:
    age, ratio = g["look_age_ms"], g["ratio"]
    nulls = "; ".join(f"{n}: {reason}" for reason, n in g["null_reasons"].items()) or "none"
    cells = [
        name,
        status,
        str(g["spells"]),
        f"{g['looked']} ({_pct(g['looked_in_first_second'])})",
        f"{_num(age['p50'], 0)} / {_num(age['max'], 0)}",
        _pct(g["with_number"]),
        f"{_num(ratio['p50'], 2)} ({_num(ratio['p10'], 2)}-{_num(ratio['p90'], 2)})",
        _pct(g["within_2x"]),
        _pct(g["first_second"]["within_2x"]),
        nulls,
        holds_text,
    ]
    return "| " + " | ".join(cells) + " |"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"
