"""Where a light request's TTFT goes, and how the flood's requests start once sent: the
stages read from the jobs' times (pure parts)."""

from __future__ import annotations

from benchmarks.fairness.stages import flood_summary, stages_of, summary


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


def test_the_flood_summary_says_how_fast_its_jobs_went_and_how_long_each_took_to_start() -> None:
    # Sent at 0, 50, 100 and 200 ms: three gaps in 0.2 s, 15 a second.
    times = [[0, 0, 2, 100], [0, 50, 53, 160], [0, 100, 101, 190], [0, 200, 210, 330]]
    jobs = [{"user": "A", "dispatched_ms": t[1], **stages_of(t)} for t in times]
    found = flood_summary(jobs)
    assert found["sent_per_s"] == 15.0
    assert found["hand_over"] == {"p50": 2.5, "max": 10}
    assert found["engine"] == {"p50": 102.5, "max": 120}  # 98, 107, 89, 120
    assert found["jobs"] == 4 and "queue" not in found  # it waits for admission by design
    assert flood_summary(jobs[:1]) == {}
