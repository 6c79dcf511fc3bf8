"""``fairq bench fairness``: the real harness on a small scenario, and its report.

The integration test runs arms (a) and (c) with real processes (simulator,
Redis, dispatcher, workers, gateway) on the small default profile, and checks
that the outputs are written and the figures are sane. It asserts nothing
about speed: the figures depend on the machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks._fairness_arms import ARMS, config_problem, parse_arms
from benchmarks._fairness_load import Scenario
from benchmarks._fairness_report import compare, criteria, render
from fairq.cli import main

SMALL = [
    "--power-requests", "30", "--prompt-tokens", "20", "--output-tokens", "20",
    "--light-users", "2", "--light-start-s", "0.1", "--light-interval-s", "0.2",
    "--arms", "a,c", "--profile", "default",
]  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_a_small_run_writes_table_json_and_plot_with_every_light_request_measured(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(
        main, ["bench", "fairness", *SMALL, "--out", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output

    figures = json.loads(result.stdout)
    assert figures == json.loads((tmp_path / "fairness.json").read_text())
    assert (tmp_path / "fairness.png").read_bytes().startswith(b"\x89PNG")
    markdown = (tmp_path / "fairness.md").read_text()
    assert "| (c) fairq + backpressure |" in markdown and "estimates" in markdown
    assert figures["idle_ttft_ms"] > 0 and figures["machine"]["cores"]
    assert figures["criteria"]["evaluated"]
    for key in ("a", "c"):
        arm = figures["arms"][key]
        assert arm["available"], arm
        assert arm["errors"] == [] and arm["power_ok"] == 30
        assert [r["user"] for r in arm["light"]] == ["B", "C"]
        assert all(r["ttft_ms"] > 0 and r["error"] is None for r in arm["light"])
        assert all(r["output_tokens"] == 50 for r in arm["light"])
        assert arm["output_tokens"] == 30 * 20 + 2 * 50
        assert arm["output_tok_s"] > 0 and arm["power_done_s"] > 0
        assert arm["engine"]["trace"]["t_s"] and arm["engine"]["scrape_failures"] == 0


def test_unknown_arms_are_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["bench", "fairness", "--arms", "a,z"])
    assert result.exit_code == 2
    assert "unknown arm" in result.output


def test_arms_keep_the_order_given_and_drop_repeats() -> None:
    assert [a.key for a in parse_arms("c, a,c")] == ["c", "a"]


def test_the_light_users_come_two_at_once_then_one_per_interval() -> None:
    scenario = Scenario(light_users=4, light_start_s=1.0, light_interval_s=5.0)
    assert scenario.light_schedule() == [("B", 1.0), ("C", 1.0), ("D", 6.0), ("E", 11.0)]


def test_fairq_model_settings_of_every_arm_are_checked_against_the_installed_fairq() -> None:
    for arm in ARMS.values():
        problem = config_problem(arm, "m", "http://127.0.0.1:1")
        assert problem is None or "fairq rejects" in problem or "no fairness policy" in problem


def _arm(p95: float, tok_s: float) -> dict[str, Any]:
    return {
        "title": "t",
        "available": True,
        "light_ttft_ms": {"p50": p95, "p95": p95, "max": p95, "measured": 2, "sent": 2},
        "power_done_s": 10.0,
        "power_errors": 0,
        "output_tok_s": tok_s,
        "engine": {"peak_waiting": 3.0},
    }


def test_the_report_checks_the_done_when_and_names_an_unavailable_arms_reason() -> None:
    arms = {
        "a": _arm(p95=4000.0, tok_s=1000.0),
        "c": _arm(p95=100.0, tok_s=950.0),
        "f": {"title": "engine priority", "available": False, "reason": "no priority"},
    }
    compare(arms, idle_ms=40.0)
    checks = criteria(arms)
    assert checks["p95_at_least_20x_lower_than_a"] == {"value": 40.0, "bound": 20.0, "holds": True}
    assert checks["p95_within_2x_idle"]["holds"] is False  # 100 ms is 2.5x of 40 ms
    assert checks["tok_s_at_least_90pct_of_a"]["holds"] is True
    assert checks["all_hold"] is False
    result = {
        "arms": arms, "criteria": checks, "date": "d", "engine": "e", "simulated": True,
        "idle_ttft_ms": 40.0, "machine": {"cores": 2, "platform": "p", "python": "3"},
        "scenario": vars(Scenario()),
    }  # fmt: skip
    text = render(result)
    assert "not available: no priority" in text and "MISSED" in text
