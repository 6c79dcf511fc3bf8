"""Whose CPU an arm spent, and keeping the engine's core apart from everyone else's.

On a small machine fairq's processes share cores with the engine, so a loss of
tokens/s may be fairq's own cost or CPU it took from the engine. Two tools tell
the causes apart:

- ``CpuMeter`` reads the CPU seconds (user + system) of the engine's processes,
  fairq's processes (Redis included) and the load client (this process) over the
  flood, from each process's own counters. Processes are grouped by who started
  them: everything this process started while the engine came up is the engine's,
  everything started after is fairq's.
- ``pinned`` moves every thread of this process to the given cores (children
  inherit the mask of the thread that starts them), and ``pin_pids`` moves
  processes already running (the simulator) to the engine's cores. The same
  pinning applies in every arm, fairq's or direct.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field

import psutil

ENGINE_CPUS = frozenset({0})
FAIRQ_CPUS = frozenset({1})  # fairq's processes and the load client


def descendants() -> set[int]:
    """Every process this one started, and theirs."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _threads(pid: int | str) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def pin_pids(pids: Collection[int], cpus: Collection[int]) -> None:
    """Every thread of each process onto ``cpus`` (gone processes are skipped)."""
    for pid in pids:
        for tid in _threads(pid):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, set(cpus))


@contextlib.contextmanager
def pinned(cpus: Collection[int]) -> Iterator[None]:
    """This process's threads on ``cpus`` until the block ends, then back where they were."""
    before = os.sched_getaffinity(0)
    pin_pids([os.getpid()], cpus)
    try:
        yield
    finally:
        pin_pids([os.getpid()], before)


def pinning_problem(cpus_needed: Collection[int]) -> str | None:
    """Why the cores cannot be pinned here (None: they can)."""
    if not hasattr(os, "sched_setaffinity"):
        return "CPU pinning needs Linux (os.sched_setaffinity)"
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus_needed) - allowed)
    if missing:
        return f"CPU pinning needs cores {sorted(cpus_needed)}; this process has {sorted(allowed)}"
    return None


@dataclass(frozen=True)
class ProcessGroups:
    """The arm's processes: the engine's and fairq's, and a label for each of fairq's."""

    engine: frozenset[int] = frozenset()
    fairq: frozenset[int] = frozenset()
    labels: Mapping[int, str] = field(default_factory=dict)


def cpu_seconds(pids: Collection[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        out[pid] = times.user + times.system
    return out


def cpu_split(
    before: Mapping[int, float],
    after: Mapping[int, float],
    groups: ProcessGroups,
    client_s: float,
) -> dict[str, object]:
    """CPU seconds per group between two readings; a process seen only in ``after``
    counts from zero, one gone by then is left out (its last seconds unknown)."""
    spent = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    by_process: dict[str, float] = {}
    for pid in sorted(groups.fairq & spent.keys()):
        label = groups.labels.get(pid, str(pid))
        by_process[label] = round(by_process.get(label, 0.0) + spent[pid], 3)
    return {
        "engine_s": round(sum(spent[p] for p in groups.engine & spent.keys()), 3),
        "fairq_s": round(sum(spent[p] for p in groups.fairq & spent.keys()), 3),
        "client_s": round(client_s, 3),
        "fairq_by_process": by_process,
    }


class CpuMeter:
    """CPU of the arm's process groups and of this process between ``start`` and ``stop``."""

    def __init__(self, groups: ProcessGroups) -> None:
        self.groups = groups
        self._before: dict[int, float] = {}
        self._client = 0.0

    def start(self) -> None:
        self._before = cpu_seconds(self.groups.engine | self.groups.fairq)
        self._client = time.process_time()

    def stop(self) -> dict[str, object]:
        after = cpu_seconds(self.groups.engine | self.groups.fairq)
        return cpu_split(self._before, after, self.groups, time.process_time() - self._client)
