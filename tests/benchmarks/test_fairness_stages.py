"""Where a light request's TTFT goes: the stages read from its job's times (pure parts)."""

from __future__ import annotations

from benchmarks._fairness_stages import stages_of, summary


def test_a_jobs_stages_are_the_gaps_between_its_moves() -> None:
    # queued at 1000, dispatched 1003, started 1005, first output 1030
    assert stages_of([1000, 1003, 1005, 1030]) == {"queue": 3, "hand_over": 2, "engine": 25}


def test_the_summary_gives_medians_maxima_and_the_rest_of_the_clients_ttft() -> None:
    times = [[0, 2, 3, 13], [0, 4, 5, 25], [0, 1, 2, 10]]
    jobs = [{"user": user, **stages_of(t)} for user, t in zip("BCD", times, strict=True)]
    found = summary(jobs, [15.0, 30.0, 14.0])
    assert found["queue"] == {"p50": 2, "max": 4}
    assert found["engine"] == {"p50": 10, "max": 20}
    assert found["gateway"]["p50"] == 15.0 - 13  # median TTFT less the median inside fairq
    assert found["jobs"] == 3
    assert summary([], []) == {}
