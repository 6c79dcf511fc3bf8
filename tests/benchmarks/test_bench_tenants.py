"""``fairq bench tenants``: the real harness on a small interactive tail, and its verdict.

The integration test runs arms (a) and (c) with real processes (simulator, Redis,
dispatcher, workers, batch worker, gateway) on tiny sizes and checks that every request
and batch line was measured; it asserts nothing about speed. The verdict is pinned on
hand-made figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks.tenants.plan import TailSizes, interactive_stream
from benchmarks.tenants.report import render, verdict
from fairq.cli import main

TINY = [
    "--interactive-requests", "30", "--rate", "20", "--interactive-users", "6",
    "--prompt-tokens", "32", "--output-tokens", "8", "--power-requests", "30",
    "--power-output-tokens", "32", "--batch-lines", "12", "--batch-output-tokens", "16",
    "--profile", "default",
]  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_tiny_tail_measures_every_request_and_batch_line_of_each_arm(tmp_path: Path) -> None:
    args = ["bench", "tenants", *TINY, "--arms", "a,c", "--out", str(tmp_path), "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures == json.loads((tmp_path / "tenants.json").read_text())
    assert "| (c) fairq defaults" in (tmp_path / "tenants.md").read_text()
    for key, via in (("a", "requests"), ("c", "batch API")):
        arm = figures["arms"][key]
        assert arm["status"] == "ok" and arm["failed"] == 0, arm
        for phase in ("alone", "flooded"):
            assert arm[phase]["ttft_ms"]["count"] == 30
            assert arm[phase]["itl_ms"]["count"] == 30 * (8 - 1)  # every gap of every stream
            assert 0 < arm[phase]["ttft_ms"]["p50"] <= arm[phase]["ttft_ms"]["p99"]
        assert arm["power_ttft_ms"]["count"] == 30
        assert arm["batch"] == arm["batch"] | {"lines": 12, "completed": 12, "via": via}
        assert arm["engine"]["steps"] > 0
    v = figures["verdict"]
    assert v["batch_done"] and v["ttft_p99_ratio"] > 0 and v["steps_of_fifo"] > 0


def test_the_interactive_stream_is_poisson_at_its_rate_and_the_same_every_time() -> None:
    sizes = TailSizes(interactive_requests=2000, rate_per_s=10.0, interactive_users=7)
    stream = interactive_stream(sizes)
    assert stream == interactive_stream(sizes)
    assert stream[-1].planned.at_s / 1999 == pytest.approx(0.1, rel=0.1)
    assert {s.planned.user for s in stream[:7]} == {f"i{i:03d}" for i in range(7)}


def _arm(alone_p99: float, flooded_p99: float, itl: tuple[float, float], steps: float, *,
         done: int = 10, status: str = "ok") -> dict[str, Any]:  # fmt: skip
    def lat(p99: float) -> dict[str, Any]:
        return {"count": 100, "p50": p99 / 2, "p95": p99 * 0.9, "p99": p99}

    return {
        "title": "t", "status": status, "failed": 0 if status == "ok" else 1,
        "first_error": None if status == "ok" else "HTTP 500: boom",
        "alone": {"ttft_ms": lat(alone_p99), "itl_ms": lat(itl[0])},
        "flooded": {"ttft_ms": lat(flooded_p99), "itl_ms": lat(itl[1])},
        "power_ttft_ms": lat(50.0), "batch": {"lines": 10, "completed": done, "via": "batch API"},
        "engine": {"steps": steps},
    }  # fmt: skip


def test_the_tail_holds_only_within_every_bound_and_never_for_a_failed_arm() -> None:
    fifo = _arm(100, 9000, (10, 30), 1000)
    assert verdict({"a": fifo, "c": _arm(100, 118, (10, 10.9), 1029)})["holds"] is True
    assert verdict({"a": fifo, "c": _arm(100, 125, (10, 10.9), 1029)})["holds"] is False
    assert verdict({"a": fifo, "c": _arm(100, 118, (10, 11.5), 1029)})["holds"] is False
    assert verdict({"a": fifo, "c": _arm(100, 118, (10, 10.9), 1040)})["holds"] is False
    assert verdict({"a": fifo, "c": _arm(100, 118, (10, 10.9), 1029, done=9)})["holds"] is False
    failed = verdict({"a": fifo, "c": _arm(100, 118, (10, 10.9), 1029, status="FAILED")})
    assert failed == {"holds": False, "why": "arm (c) failed: HTTP 500: boom"}
    assert verdict({"c": _arm(100, 118, (10, 10.9), 1029)})["holds"] is None  # no FIFO arm


def test_the_table_marks_a_failed_arm() -> None:
    arms = {"a": _arm(100, 9000, (10, 30), 1000), "c": _arm(100, 118, (10, 10.9), 1029,
                                                           status="FAILED")}  # fmt: skip
    result = {"arms": arms, "verdict": verdict(arms), "engine_note": "Estimates.",
              "machine": {"cores": 2}, "sizes": {"rate_per_s": 12.0}}  # fmt: skip
    text = render(result)
    assert "**FAILED**: 1 requests" in text and "Holds (arm c): **no**" in text


def test_sizes_come_from_the_engines_preset_unless_a_flag_gives_them() -> None:
    from benchmarks.tenants.cli import sized
    from benchmarks.tenants.plan import PRESETS

    assert sized("sim", {"rate": None, "seed": 0}) == PRESETS["h100"]
    tiny = sized("vllm", {"rate": 5.0, "power_requests": None, "seed": 0})
    assert tiny.rate_per_s == 5.0 and tiny.power_requests == PRESETS["tiny"].power_requests
    # The tiny model's context is 512 tokens: its preset's longest request fits.
    assert tiny.prompt_tokens + max(tiny.power_output_tokens, tiny.batch_output_tokens) < 512
