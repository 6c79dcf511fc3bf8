"""Small helpers shared by the benchmarks: percentiles, tables, machine facts, CPU."""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """Each named process's CPU so far (user + system), from its own counters."""
    out = {}
    for name, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        out[name] = times.user + times.system
    return out


def machine() -> dict[str, object]:
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def save(out: str, name: str, result: dict[str, object], text: str) -> None:
    """Write a benchmark's figures (``name``.json) and table (``name``.md) to ``out``."""
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"{name}.json").write_text(json.dumps(result, indent=2))
    Path(out, f"{name}.md").write_text(text + "\n")
