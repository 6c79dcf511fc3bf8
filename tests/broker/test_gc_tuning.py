"""The garbage collector settings of long-running processes (broker.process.gc_tuning), checked in a
fresh interpreter: settling the test process itself would change every later test."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from broker.process import gc_tuning
from broker.settings import Settings
before = gc.get_threshold()
gc_tuning.settle(Settings(gc_young_threshold={threshold}))
print(before, gc.get_threshold(), gc.get_freeze_count() > 0)
"""


def settled(threshold: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(threshold=threshold)],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip()


def test_a_settled_process_collects_less_often_and_freezes_its_start_up() -> None:
    assert settled(50_000) == "(700, 10, 10) (50000, 10, 10) True"


def test_zero_keeps_cpythons_collector_as_it_is() -> None:
    assert settled(0) == "(700, 10, 10) (700, 10, 10) False"
