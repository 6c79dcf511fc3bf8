"""``python -m benchmarks.fairness.wait_estimate``: a small flood end to end, and its pure parts.

The integration test runs one small flood with real processes (simulator, Redis,
dispatcher, workers, gateway and the sampler's own process) and checks that every queued
job was looked at and measured; it asserts nothing about the estimate's accuracy, which
depends on the machine. The unit tests pin the spells read from job hashes and the
figures on hand-made values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks.fairness.wait_estimate import main
from benchmarks.fairness.wait_sampler import SpellBook
from benchmarks.fairness.wait_summary import flood_figures, holds, summary, within


def _hash(state: str, **fields: object) -> dict[bytes, bytes]:
    h = {b"st": state.encode(), b"u": b"A"}
    names = {"qe": b"qe", "tq": b"tq", "td": b"td", "pk": b"pk"}
    h.update({names[k]: str(v).encode() for k, v in fields.items()})
    return h


def test_a_spell_opens_when_a_job_is_first_seen_queued_and_ends_at_its_dispatch() -> None:
    book = SpellBook(tick_ms=200)
    opened = book.observe("j1", _hash("queued", qe="1000-0"), now_ms=1150)
    assert opened is not None and (opened.queued_ms, opened.taken_back) == (1000, 0)
    assert book.observe("j1", _hash("queued", qe="1000-0"), now_ms=1350) is None  # looked at
    book.observe("j1", _hash("running", qe="1000-0", tq=1000, td=4000), now_ms=4100)
    assert (opened.left, opened.left_ms) == ("dispatched", 4000)
    assert book.unended() == ["j1"]
    book.observe("j1", _hash("completed", qe="1000-0", tq=1000, td=4000), now_ms=9000)
    assert book.unended() == [] and len(book.spells) == 1


def test_a_job_taken_back_and_queued_again_opens_a_spell_of_its_own() -> None:
    book = SpellBook(tick_ms=200)
    book.observe("j1", _hash("running", qe="1000-0", tq=1000, td=1100), now_ms=1200)
    (first,) = book.spells  # dispatched within a tick: no look, its wait from the record
    assert (first.look_ms, first.left_ms, first.queued_ms) == (None, 1100, 1000)
    again = book.observe("j1", _hash("queued", qe="1000-0", td=1100, pk=1), now_ms=5000)
    assert again is not None and (again.taken_back, again.queued_ms) == (1, 5000)
    # dispatched and taken back once more between two reads: the spell ended at dispatch
    book.observe("j1", _hash("queued", qe="1000-0", td=6000, pk=2), now_ms=6100)
    assert (again.left, again.left_ms) == ("dispatched", 6000)
    assert [s.taken_back for s in book.spells] == [0, 1, 2]


def test_a_job_cancelled_from_the_queue_ends_its_spell_undispatched() -> None:
    book = SpellBook(tick_ms=200)
    spell = book.observe("j1", _hash("queued", qe="1000-0"), now_ms=1100)
    book.observe("j1", _hash("cancelled", qe="1000-0"), now_ms=1300)
    assert spell is not None and (spell.left, spell.left_ms) == ("ended", None)


def test_within_2x_is_a_ratio_between_half_and_double_or_two_small_waits() -> None:
    assert within(10.0, 5.0) and within(2.5, 5.0) and not within(10.1, 5.0)
    assert not within(2.4, 5.0) and not within(None, 5.0)
    assert within(0.0, 0.4) and within(0.5, 0.1)  # both at most 0.5 s: "now"
    assert not within(0.0, 0.6) and not within(0.6, 0.1)


def _spell(user: str, look: int | None, estimate: float | None, left: int | None, *,
           reason: str | None = None, taken_back: int = 0) -> dict[str, Any]:  # fmt: skip
    return {"job_id": "j", "user": user, "taken_back": taken_back, "queued_ms": 0,
            "look_ms": look, "look_took_ms": 1, "jobs_ahead": 0, "estimate_s": estimate,
            "reason": reason, "left_ms": left, "left": "dispatched"}  # fmt: skip


def test_the_figures_count_nulls_as_misses_and_unlooked_spells_apart() -> None:
    spells = [
        _spell("A", 500, 10.0, 10_500),  # ratio 1
        _spell("A", 500, 3.0, 10_500),  # 0.3: a miss
        _spell("A", 500, None, 5_500, reason="no drain known yet"),  # a miss
        _spell("A", 500, 0.1, 700),  # both small: within
        _spell("A", None, None, 50),  # dispatched before any look
        _spell("A", None, None, 600),
    ]
    figures = summary(spells)
    assert (figures["spells"], figures["looked"], figures["not_looked"]) == (6, 4, 2)
    assert figures["not_looked_wait_ms_max"] == 600
    assert figures["with_number"] == 0.75 and figures["within_2x"] == 0.5
    assert figures["ratio"]["p50"] == pytest.approx(0.5)  # of 1, 0.3 and 0.5
    assert figures["null_reasons"] == {"no drain known yet": 1}
    assert figures["looked_in_first_second"] == 1.0
    assert figures["first_second"]["within_2x"] == 0.5
    late = summary([{**spells[0], "queued_ms": -1_000}, spells[1]])  # one looked at after 1.5 s
    assert late["within_2x"] == 0.5 and late["first_second"]["within_2x"] == 0.0


def test_the_flood_holds_only_without_failures_and_with_80_percent_within() -> None:
    spells = [_spell("A", 0, 1.0, 1000)] * 4 + [_spell("A", 0, 9.0, 1000)]
    flood = {"status": "ok", "figures": flood_figures(spells, ["B"])}
    assert holds(flood) and not holds({**flood, "status": "FAILED"})
    late = [{**s, "queued_ms": -2_000} for s in spells[:2]] + spells[2:]  # 1 of 3 in 1st s
    assert not holds({"status": "ok", "figures": flood_figures(late, ["B"])})
    flood["figures"] = flood_figures([*spells, _spell("A", 0, None, 1000)], ["B"])
    assert not holds(flood)  # 4 of 6
    split = flood_figures([*spells, _spell("B", 0, 1.0, 1000, taken_back=1)], ["B"])
    assert split["light"]["spells"] == 0 and split["taken_back"]["spells"] == 1


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_small_flood_looks_at_every_queued_job_and_measures_its_wait(tmp_path: Path) -> None:
    args = ["--scenario", "seed", "--profile", "default", "--power-requests", "80",
            "--prompt-tokens", "20", "--output-tokens", "30", "--light-users", "2",
            "--light-start-s", "0.2", "--light-interval-s", "0.2", "--light-output-tokens",
            "10", "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    figures = json.loads((tmp_path / "wait_estimate.json").read_text())
    seed = figures["floods"]["seed"]
    assert seed["status"] == "ok" and seed["failed_requests"] == 0
    requests = seed["figures"]["requests"]
    assert requests["spells"] >= 80 and requests["looked"] > 0  # 80 of A, 2 light
    assert requests["measured"] == requests["looked"]  # every look's dispatch was seen
    assert requests["with_number"] is not None and requests["within_2x"] is not None
    assert "| seed | ok |" in (tmp_path / "wait_estimate.md").read_text()
