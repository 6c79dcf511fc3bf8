"""The scenario matrix's pure parts (``benchmarks.fairness.matrix``): cells, sizes and the
verdict per cell, on hand-made arms."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.fairness.matrix import CELLS, parse_cells, render, sizes, verdict
from benchmarks.lib.engine_watch import Sample, backlogged_work, batch_run, drain_s


def arm(p95_steps: float | None, steps: float, status: str = "ok") -> dict[str, Any]:
    """An arm whose engine computed 1,000 output tokens in ``steps`` steps while the flood
    was backlogged, and 10% more steps over the whole run (its drain)."""
    backlogged = {"steps": steps, "tokens": 1000.0, "tokens_per_step": 1000.0 / steps}
    return {
        "status": status,
        "light_ttft_ms": {"p50": 10.0, "p95": 20.0, "max": 30.0},
        "light_ttft_steps": {"p50": 1.0, "p95": p95_steps, "max": 2.0},
        "engine": {"work": {"steps": steps * 1.1}, "backlogged": backlogged},
        "cpu": {"fairq_s": 1.5},
    }


def test_cells_are_chosen_by_batch_or_kv_and_all_means_every_one() -> None:
    assert [c.batch for c in parse_cells("4,16")] == [4, 16]
    assert parse_cells("kv")[0].kv_tokens and parse_cells("kv")[0].runs == 12
    assert parse_cells("all") == list(CELLS)
    with pytest.raises(ValueError, match="unknown cell"):
        parse_cells("5")


def test_floods_are_sized_to_what_the_engine_runs_at_once() -> None:
    small, big = parse_cells("4,256")
    assert sizes("seed", small)["power_requests"] == 80  # twenty waves
    assert sizes("seed", big)["power_requests"] == 500  # the preset's
    assert sizes("long", small)["power_requests"] == 16  # more than fill the batch
    assert sizes("mixed", parse_cells("kv")[0])["power_requests"] == 72  # its KV's share


def test_the_defaults_hold_within_a_quarter_or_a_step_of_the_told_stack() -> None:
    # Told: 2 steps at p95; the bound is max(1.25 x 2, 2 + 1) = 3 steps.
    held = verdict({"a": arm(900, 1000), "c": arm(3.0, 1030), "t": arm(2.0, 1010)})
    assert held["holds"] and held["p95_bound_steps"] == 3.0
    assert held["steps_of_fifo"] == pytest.approx(1.03)
    assert not verdict({"a": arm(900, 1000), "c": arm(3.1, 1000), "t": arm(2.0, 1000)})["holds"]
    # Engine steps beyond 103% of FIFO's miss whatever the latency.
    assert not verdict({"a": arm(900, 1000), "c": arm(1.0, 1031), "t": arm(2.0, 1000)})["holds"]
    # At larger figures the ratio bounds: 1.25 x 10 = 12.5.
    assert verdict({"a": arm(900, 1000), "c": arm(12.4, 1000), "t": arm(10.0, 1000)})["holds"]


def test_an_arm_that_failed_never_holds_and_one_not_run_is_not_judged() -> None:
    failed = verdict({"a": arm(900, 1000), "c": arm(1.0, 1000, "FAILED"), "t": arm(2.0, 1000)})
    assert failed["holds"] is False
    assert verdict({"a": arm(900, 1000), "c": arm(1.0, 1000)})["holds"] is None


def test_the_matrix_prints_a_row_per_cell_and_flood() -> None:
    arms = {"a": arm(900, 1000), "c": arm(1.5, 1010), "t": arm(1.4, 1000), "e": arm(5, 999)}
    section = {"arms": arms, "matrix": verdict(arms)}
    result = {
        "engine_note": "Simulator figures are estimates.",
        "machine": {"cores": 2},
        "cells": {"batch 4": {"seed": section}},
    }
    (row,) = [line for line in render(result).splitlines() if line.startswith("| batch 4")]
    assert "| seed |" in row and "| 101.0% | 101.0% |" in row and row.endswith("| yes |")


def test_the_drain_begins_when_at_most_a_batch_of_the_flood_is_left() -> None:
    assert drain_s([5.0, 1.0, 3.0, 2.0, 4.0], batch=2) == 3.0  # then 4.0 and 5.0 were left
    assert drain_s([1.0, 2.0], batch=4) is None  # it never filled the batch


def test_work_while_backlogged_is_counted_up_to_the_drain() -> None:
    samples = [
        Sample(t_s=t, waiting=0, running=4, generated=g, itl_sum_s=0, itl_count=0, steps=n)
        for t, g, n in [(0.0, 0, 0), (1.0, 400, 100), (2.0, 700, 200), (3.0, 800, 300)]
    ]
    work = backlogged_work(samples, drain_s=2.5)
    assert work == {"steps": 200, "tokens": 700, "tokens_per_step": 3.5}
    assert backlogged_work(samples, drain_s=0.5) is None


def test_the_drain_counts_the_batch_the_engine_ran_while_requests_waited() -> None:
    def sample(running: float, waiting: float) -> Sample:
        return Sample(t_s=0, waiting=waiting, running=running, generated=0, itl_sum_s=0,
                      itl_count=0)  # fmt: skip

    # A KV-bound engine ran 40 short prompts at once, then 20 or 18 as their answers grew.
    kv_bound = [sample(40, 0), sample(20, 5), sample(18, 9), sample(19, 7)]
    assert batch_run(kv_bound) == 19
    assert batch_run([sample(8, 0), sample(6, 0)]) == 8  # nothing waited: the peak
