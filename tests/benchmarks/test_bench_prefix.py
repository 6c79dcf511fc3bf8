"""``fairq bench prefix``: the real harness on a tiny run, and its pure parts.

The integration test runs both arms on both loads with real processes (two
simulated replicas, Redis, dispatcher, workers, gateway) on the small default
profile, and checks the report's shape and that every request of both arms
succeeded; it asserts nothing about speed, which depends on the machine. Every
process is stopped by the harness, pass or fail.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from click.testing import CliRunner

from benchmarks.prefix.cli import COLUMNS, summarize
from benchmarks.prefix.load import LoadRun, Turn, agent, chat, sessions, words
from fairq.cli import main

TINY = [
    "--replicas", "2", "--profile", "default", "--chat-sessions", "3", "--chat-turns", "2",
    "--agent-sessions", "2", "--agent-turns", "2", "--deadline-s", "60", "--loads", "agent",
]  # fmt: skip


def test_a_tiny_run_reports_both_arms_all_succeeded(tmp_path: Path) -> None:
    """One load, both arms: a stack per arm costs ~5 s, and the loads' shapes are tested
    without one below."""
    result = CliRunner().invoke(main, ["bench", "prefix", *TINY, "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures == json.loads((tmp_path / "prefix.json").read_text())
    assert figures["engine"] == "simulator (estimates)" and figures["failed_arms"] == []
    assert list(figures["loads"]) == ["agent"]
    expected = {"agent": 2 * 2}
    for name, section in figures["loads"].items():
        assert list(section["arms"]) == ["least_loaded", "prefix"]
        for arm in section["arms"].values():
            assert arm["requests"] == arm["succeeded"] == expected[name]
            assert arm["errors"] == []
            assert 0 < arm["ttft_p50_ms"] <= arm["ttft_p95_ms"]
            assert arm["tokens_per_s"] > 0
            # Every session shares its load's system prompt: later requests hit it.
            assert 0 < arm["prefix_hit_rate"] < 1
            assert sum(arm["served_per_replica"]) == expected[name]
            assert len(arm["served_per_replica"]) == 2
    table = (tmp_path / "prefix.md").read_text()
    assert "Simulator (estimates)" in table and all(column in table for column in COLUMNS)


def test_a_conversations_turns_grow_and_share_the_loads_system_prompt() -> None:
    shape = chat(sessions=3, turns=3)
    first, second, _ = sessions(shape, seed=7)
    assert first.messages[0] == second.messages[0]  # the shared system prompt
    assert first.messages[1] != second.messages[1]  # each its own opening
    before = list(first.messages)
    first.next_turn(shape)
    assert first.messages[: len(before)] == before and len(first.messages) == len(before) + 2
    assert [m["role"] for m in first.messages[-2:]] == ["assistant", "user"]
    assert sessions(shape, seed=7)[0].messages == before  # the same text every run
    assert len(words(random.Random(1), 100)) >= 400  # about 4 characters a token
    assert agent().turn_tokens > chat().turn_tokens


def test_a_summary_counts_failures_hit_rate_and_spread() -> None:
    load = LoadRun(
        turns=[
            Turn("a", 0, 10, 0.0, ttft_s=0.1, tokens=8),
            Turn("b", 0, 10, 0.0, ttft_s=0.3, tokens=8),
            Turn("c", 0, 10, 0.0, error="HTTP 503: b''"),
        ],
        wall_s=2.0,
    )
    counters = [
        {"queries": 300.0, "hits": 150.0, "requests": 3.0},
        {"queries": 100.0, "hits": 50.0, "requests": 1.0},
    ]
    figures = summarize(load, counters, None)
    assert (figures["requests"], figures["succeeded"]) == (3, 2)
    assert figures["errors"] == ["HTTP 503: b''"]
    assert (figures["ttft_p50_ms"], figures["tokens_per_s"]) == (200.0, 8.0)
    assert (figures["prefix_hit_rate"], figures["prefilled_tokens"]) == (0.5, 200)
    assert (figures["served_per_replica"], figures["load_max_over_mean"]) == ([3, 1], 1.5)
