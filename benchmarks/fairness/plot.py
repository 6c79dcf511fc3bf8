"""The fairness benchmark's figure per scenario: one panel per arm, as in the seed's figures.

Each panel plots every light request's time to first token (log scale) against
when it arrived, one marker per user, and on a second axis the engine's queue
over the same time: requests waiting (shaded) and running (the batch, a line).
Panels share their axes, so arms compare at a glance. matplotlib (the
``bench`` extra) is imported only here, with the Agg backend: no display is
needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

_MARKERS = "os^Dv<>ph*"


def plot(section: Mapping[str, Any], result: Mapping[str, Any], path: Path) -> None:
    """One scenario's ``section`` of the run's ``result`` as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(section["arms"].items())
    cols = 2 if len(arms) > 1 else 1
    rows = -(-len(arms) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(6.5 * cols, 3.6 * rows), sharex=True, sharey=True, squeeze=False
    )
    top = max([1.0, *(_engine_peak(arm) for _, arm in arms)]) * 1.05
    idle_ms = section.get("idle_ttft_ms")
    for ax, (key, arm) in zip(axes.flat, arms, strict=False):
        if idle_ms:
            ax.axhline(idle_ms / 1000, color="black", ls=":", lw=0.8, label="idle engine")
        _panel(ax, key, arm, top)
    for ax in list(axes.flat)[len(arms) :]:
        ax.set_visible(False)
    fig.suptitle(_title(section, result), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _title(section: Mapping[str, Any], result: Mapping[str, Any]) -> str:
    s = section["scenario"]
    note = "simulator figures are estimates" if result["simulated"] else "real engine"
    heavy = len(s["heavy_weights"])
    return (
        f"Scenario {s['name']}: light users' TTFT by arrival; {heavy} heavy user(s) flood "
        f"{s['power_requests']} requests each at t=0\n({result['engine']}; {note})"
    )


def _engine_peak(arm: Mapping[str, Any]) -> float:
    if arm["status"] != "ok":
        return 0.0
    trace = arm["engine"]["trace"]
    return float(max([0.0, *trace["waiting"], *trace["running"]]))


def _why(arm: Mapping[str, Any]) -> str:
    if arm["status"] == "FAILED":
        failed = arm["failed"]
        count = "" if failed.get("count") is None else f"{failed['count']} requests, "
        return f"FAILED:\n{count}first: {str(failed['first_error'])[:120]}"
    return f"not available:\n{arm['reason']}"


def _panel(ax: Any, key: str, arm: Mapping[str, Any], queue_top: float) -> None:
    ax.set_title(f"({key}) {arm['title']}", fontsize=9)
    ax.set_yscale("log")
    ax.set_xlabel("arrival time (s after t=0)")
    ax.set_ylabel("TTFT (s)")
    ax.grid(True, which="both", alpha=0.3)
    if arm["status"] != "ok":
        ax.text(0.5, 0.5, _why(arm), ha="center", va="center", transform=ax.transAxes,
                fontsize=8, wrap=True)  # fmt: skip
        return
    trace = arm["engine"]["trace"]
    queue = ax.twinx()
    queue.fill_between(trace["t_s"], trace["waiting"], step="post", color="grey", alpha=0.3)
    queue.plot(trace["t_s"], trace["running"], drawstyle="steps-post", color="grey", lw=0.8)
    queue.set_ylim(0, queue_top)
    queue.set_ylabel("engine: waiting (shaded), running (line)", color="grey", fontsize=8)
    users = sorted({r["user"] for r in arm["light"]})
    for i, user in enumerate(users):
        points = [r for r in arm["light"] if r["user"] == user and r["ttft_ms"] is not None]
        ax.scatter(
            [r["arrival_s"] for r in points],
            [r["ttft_ms"] / 1000 for r in points],
            marker=_MARKERS[i % len(_MARKERS)],
            label=user,
            zorder=3,
        )
    ax.set_zorder(queue.get_zorder() + 1)  # markers above the queue's shading
    ax.patch.set_visible(False)
    ax.legend(fontsize=7, loc="upper right", title="user", title_fontsize=7)
