"""The tenants harness's figures on hand-made cases."""

from __future__ import annotations

import pytest

from benchmarks.tenants.figures import (
    Window,
    arm_status,
    jain,
    latencies,
    share_errors,
    token_gaps,
    wanted_shares,
    windowed_shares,
)


def test_percentiles_interpolate_between_ranks_in_ms() -> None:
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    lat = latencies(values)
    assert lat.count == 100
    assert lat.p50 == pytest.approx(50.5) and lat.p95 == pytest.approx(95.05)
    assert lat.p99 == pytest.approx(99.01)
    assert latencies([]).as_dict() == {"count": 0, "p50": None, "p95": None, "p99": None}


def test_one_slow_value_in_a_hundred_moves_the_p99_not_the_p95() -> None:
    lat = latencies([0.010] * 99 + [2.0])
    assert lat.p95 == pytest.approx(10.0) and lat.p99 > 10.0


def test_token_gaps_count_tokens_of_one_read_as_zero_apart() -> None:
    reads = [(1.0, 1), (1.02, 1), (1.10, 3), (1.11, 0), (1.15, 1)]
    assert token_gaps(reads, 6) == pytest.approx([0.02, 0.08, 0.0, 0.0, 0.05])
    assert token_gaps([(2.0, 2)], 2) == [0.0]  # the first read carried two tokens
    assert token_gaps([], 0) == []


def test_the_events_after_the_last_token_make_no_gap() -> None:
    # Three tokens, then the finish reason and the usage in a read of their own.
    assert token_gaps([(1.0, 1), (1.1, 1), (1.2, 1), (1.21, 2)], 3) == pytest.approx([0.1, 0.1])


def test_windows_count_each_tenants_tokens_and_drop_the_part_window() -> None:
    events = [(0.5, "a", 10), (1.5, "b", 5), (1.9, "a", 5), (2.5, "a", 100), (-1, "a", 9)]
    windows = windowed_shares(events, ["a", "b"], (0.0, 2.6), window_s=1.0)
    assert [w.tokens for w in windows] == [{"a": 10, "b": 0}, {"a": 5, "b": 5}]
    assert windows[1].shares() == {"a": 0.5, "b": 0.5}
    assert Window(0.0, {"a": 0, "b": 0}).shares() == {"a": 0.0, "b": 0.0}


def test_share_errors_are_relative_to_the_weights_share() -> None:
    weights = {"a": 4.0, "b": 1.0}
    assert wanted_shares(weights) == {"a": 0.8, "b": 0.2}
    errors = share_errors({"a": 0.76, "b": 0.24}, weights)
    assert errors == {"a": pytest.approx(-0.05), "b": pytest.approx(0.2)}


def test_jain_is_one_at_the_weights_and_one_over_n_when_one_takes_all() -> None:
    weights = {"a": 4.0, "b": 1.0}
    assert jain({"a": 0.8, "b": 0.2}, weights) == pytest.approx(1.0)
    assert jain({"a": 0.0, "b": 1.0}, weights) == pytest.approx(0.5)
    # Dynamo's 4:1 split that came out even: weight-normalised 0.125 and 0.5.
    assert jain({"a": 0.5, "b": 0.5}, weights) == pytest.approx(0.735, abs=0.001)
    assert jain({}, weights) == 0.0


def test_an_arm_with_one_failed_request_fails_and_names_it() -> None:
    assert arm_status([None, None]) == {"status": "ok", "failed": 0, "first_error": None}
    failed = arm_status([None, "HTTP 500: boom", "stopped: deadline reached"])
    assert failed == {"status": "FAILED", "failed": 2, "first_error": "HTTP 500: boom"}
