"""``broker.position``'s pure parts on hand-made values: the rate the queue drained while a
job waited, the wait it makes with the engine's drain, and the position a read makes (the
reads themselves: tests/broker/test_broker_contract.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from broker.position import (
    _ENDS_READ,
    _RUN_FRESH_MS,
    NO_DRAIN,
    STARTING,
    BandWait,
    Drain,
    Engines,
    Observed,
    QueuePosition,
    _ends_cover_ms,
    _engines,
    band_waits,
    drain_of,
    queue_rate,
    wait_s,
)

# A flood's first half second: the dispatcher sent 10 jobs as the engine started them,
# about one every 60 ms; the job looked at has waited 500 ms.
RAMP_AGES = (600, 550, 500, 450, 400, 300, 200, 100, 50, 10)


def test_the_queue_rate_counts_the_jobs_dispatched_while_the_job_waited() -> None:
    assert queue_rate(500, 10, RAMP_AGES, []) == 8 / 0.5  # 600 and 550 came before it
    # and those dispatched since that have already ended: 100 ms ago after 300 ms in it
    assert queue_rate(500, 10, RAMP_AGES, [(100, 300), (100, 900)]) == 9 / 0.5
    # 20 in the engine, 10 ages read: the others are younger still
    assert queue_rate(500, 20, RAMP_AGES, []) == 18 / 0.5


def test_the_queue_rate_looks_no_further_back_than_the_ends_read_reach() -> None:
    # the ends read reach 200 ms back (more may have ended before, uncounted): 4 in the
    # engine came in since, and the end 50 ms ago after 100 ms in it
    assert queue_rate(500, 10, RAMP_AGES, [(50, 100)], ends_cover_ms=200) == 5 / 0.2


def test_no_queue_rate_from_fewer_than_four_dispatches_while_it_waited() -> None:
    assert queue_rate(0, 10, RAMP_AGES, []) is None  # just queued
    assert queue_rate(5, 10, RAMP_AGES, []) is None  # none sent in its 5 ms
    assert queue_rate(60, 10, RAMP_AGES, []) is None  # 2 sent in its 60 ms
    assert queue_rate(200, 10, RAMP_AGES, []) == 4 / 0.2
    # behind a full batch of long answers for 20 s: two newcomers were let in
    assert queue_rate(20_000, 16, (30_000,) * 14 + (9_000, 4_000), []) is None
    assert queue_rate(500, 0, (), [(10, 5_000)]) is None  # the last end came in earlier


def test_in_a_ramp_the_queue_rate_makes_the_wait_not_the_young_jobs_ages() -> None:
    # Little's law on the ramp's jobs: 10 over their mean age (0.316 s) = 32 per second,
    # twice the 16 per second they came in at
    drain = drain_of(10, [], RAMP_AGES, None)
    assert drain is not None and round(drain.per_s) == 32
    assert wait_s(159, drain) == 5.1  # 160 ends at 32 per second
    assert wait_s(159, drain, queue_per_s=16.0) == 10.0  # 160 dispatches at 16 per second


def test_the_engines_drain_still_wins_where_it_is_the_later() -> None:
    wave = Drain(31 / 18, 18.0, (16.4,) * 31)  # a wave ends in 16.4 s
    assert wait_s(5, wave, queue_per_s=10.0) == 16.4
    assert wait_s(5, None, queue_per_s=10.0) == 0.6  # nothing else known: the queue's rate


def test_with_room_in_the_batch_the_queues_drain_alone_makes_the_wait() -> None:
    # 19 in the engine, stays of 4.2 s, but the batch has room: admission held them back a
    # moment, and the jobs ahead go in as fast as the queue has been draining
    dip = drain_of(19, [4_200], [], None)
    assert wait_s(741, dip) == 168.0  # as if 19 were all the engine runs: 39 stays, and one
    assert wait_s(741, dip, queue_per_s=15.0, batch_full=False) == 49.5
    assert wait_s(741, dip, batch_full=False) == 168.0  # the queue's drain not known


def test_the_open_batch_is_the_endpoints_batches_less_their_kept_slots() -> None:
    def status(*rows: dict[str, object]) -> bytes:
        return orjson.dumps({"endpoints": list(rows)})

    full: dict[str, object] = {"batch_slots": 256, "kept_slots": 8, "drain_per_s": 2.5}
    assert _engines(status(full, {"batch_slots": 32, "kept_slots": 1})) == (2.5, 248 + 31)
    assert _engines(status(full, {"batch_slots": None, "kept_slots": None})) == (2.5, None)
    assert _engines(None) == (None, None) and _engines(status()) == (None, None)


def test_a_newcomer_waits_by_the_drains_rate_alone() -> None:
    # a kept slot: it does not wait for the other users' dispatches
    assert wait_s(2, Drain(30.0), newcomer=True, queue_per_s=1.0) == 0.1
    # no drain known (its jobs in the engine, just sent, have no age yet): the queue's
    assert wait_s(2, None, newcomer=True, queue_per_s=1.0) == 3.0
    assert wait_s(2, None, newcomer=True) is None


# The ramp above as the engines show it; an end of the warm-up two seconds ago, after 350 ms
RAMP = Engines(10, ((2_000, 350),), RAMP_AGES)


def _observed(**engine: Any) -> Observed:
    """alice's job behind 150 of her own and 9 in higher bands, queued 500 ms ago."""
    return Observed(150, (), (), 9, replace(RAMP, **engine), newcomer=False, waited_ms=500)


def test_a_position_in_a_floods_first_second_has_a_backed_number() -> None:
    # 159 ahead; the warm-up's end came before it was queued
    position = _observed().position()
    assert position == QueuePosition(159, 10.0)
    assert _observed(batch_open=248).position() == position  # room in the batch
    # a batch of 10, full, whose jobs stay 2 s: 15 stays until the slot of the 160th frees
    slow = ((2_000, 2_000),)
    assert _observed(ended=slow, batch_open=10).position() == QueuePosition(159, 32.0)
    assert _observed(ended=slow).position() == position  # with room: the queue's drain
    assert position.public() == {
        "jobs_ahead": 159,
        "estimated_wait_s": 10.0,
        "estimated_wait_reason": None,
    }


def test_a_position_with_nothing_to_go_by_says_why_it_has_no_number() -> None:
    position = _observed(in_engine=0, ended=(), ages_ms=()).position()
    assert position == QueuePosition(159, None, NO_DRAIN)
    assert _observed().position().starting() == QueuePosition(159, None, STARTING)


def test_the_ends_read_reach_back_to_the_oldest_only_when_the_read_was_cut() -> None:
    ends = [(f"{10_000 - i}-0".encode(), {}) for i in range(_ENDS_READ)]
    assert _ends_cover_ms(ends, now_ms=10_500) == 500 + _ENDS_READ - 1
    assert _ends_cover_ms(ends[:10], now_ms=10_500) == _RUN_FRESH_MS  # every fresh end read
    # a job queued longer than ends count as fresh: the rate over the window they cover
    rate = queue_rate(2 * _RUN_FRESH_MS, 10, RAMP_AGES, [], ends_cover_ms=_RUN_FRESH_MS)
    assert rate == 10 / (_RUN_FRESH_MS / 1000)


def test_a_job_queued_now_waits_as_a_new_user_or_at_the_back_of_its_band() -> None:
    # 3 interactive jobs; in default, 150 queued by 4 users, the oldest queued 500 ms ago
    queued, users = {"interactive": 3, "default": 150}, {"interactive": 1, "default": 4}
    engines = replace(RAMP, ended=())
    waits = band_waits(["interactive", "default", "batch"], queued, users, {"default": 500},
                       engines)  # fmt: skip
    interactive, default, batch = waits
    # a new user in default: after 3 interactive jobs and one of each of the 4 users; by the
    # drain's rate (32 per second: the ramp's jobs' ages)
    assert default.new_user == QueuePosition(3 + 4, 0.3)
    # at the back: 153 ahead; the queue drained 16 per second while the oldest waited
    assert default.back == QueuePosition(153, 9.6)
    # interactive's oldest is not known: its back by the engines' figures alone (Little's
    # law on the ramp: half of what the queue's drain says, the reason for the queue's)
    assert interactive.back == QueuePosition(3, 0.1)
    assert batch.back.jobs_ahead == 153 and batch.new_user.jobs_ahead == 153
    assert default.public() == {
        "band": "default",
        "new_user": {"jobs_ahead": 7, "estimated_wait_s": 0.3, "estimated_wait_reason": None},
        "back": {"jobs_ahead": 153, "estimated_wait_s": 9.6, "estimated_wait_reason": None},
    }
    assert default.starting() == BandWait(
        "default", QueuePosition(7, None, STARTING), QueuePosition(153, None, STARTING)
    )


def test_a_job_queued_now_on_an_idle_model_has_no_figure_and_says_why() -> None:
    (idle,) = band_waits(["default"], {}, {}, {}, Engines(0))
    assert idle.new_user == idle.back == QueuePosition(0, None, NO_DRAIN)
