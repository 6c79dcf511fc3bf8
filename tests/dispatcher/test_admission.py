"""Admission on hand-made cases (pure code): targets, bursts, the TPOT ceiling,
stale and missing metrics, unhealthy endpoints, routing among endpoints, and the
express grants made from the same decisions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dispatcher.admission import (
    ADMISSION,
    AdmissionConfig,
    Decision,
    EndpointState,
    Limit,
    MetricsAdmission,
    StaticCap,
    choose_endpoint,
    held_by_unseen,
    plan_grant,
    refusals,
)
from dispatcher.round import _held

CONFIG = AdmissionConfig(
    targets={"interactive": 3, "default": 3, "batch": 1}, tpot_ceiling_s=0.150, inflight_cap=8
)
METRICS = MetricsAdmission()


def fresh(**values: object) -> EndpointState:
    base: dict[str, object] = {"endpoint": "http://a", "inflight": 0, "fresh": True}
    return EndpointState(**(base | values))  # type: ignore[arg-type]


def test_an_idle_engine_admits_a_burst_up_to_the_target() -> None:
    decision = METRICS.decide(fresh(), "interactive", CONFIG)
    assert decision.room == 3 and decision.limit is Limit.QUEUE_TARGET


def test_admission_stops_at_the_target_and_resumes_as_the_engine_drains() -> None:
    assert METRICS.decide(fresh(waiting=3, running=32, inflight=35), "default", CONFIG).room == 0
    assert METRICS.decide(fresh(waiting=5, running=32, inflight=37), "default", CONFIG).room == 0
    assert METRICS.decide(fresh(waiting=1, running=32, inflight=33), "default", CONFIG).room == 2
    assert METRICS.decide(fresh(waiting=0, running=30, inflight=30), "default", CONFIG).room == 3


def test_jobs_sent_since_the_scrape_count_until_the_engine_shows_them() -> None:
    # Not streamed: fairq cannot see them leave the engine's queue before the next scrape.
    plain = fresh(waiting=0, running=10, inflight=12, admitted_since_scrape=2,
                  plain_since_scrape=2)  # fmt: skip
    assert plain.queue_estimate == 2
    assert METRICS.decide(plain, "default", CONFIG).room == 1


def test_streamed_jobs_sent_since_the_scrape_count_only_until_their_first_token() -> None:
    # A streamed job with its first token has left the engine's queue: the lag-free count
    # of jobs without one bounds those sent since that may still wait there.
    started = fresh(waiting=0, running=10, inflight=12, admitted_since_scrape=3, unstarted=1)
    assert started.queue_estimate == 1
    assert METRICS.decide(started, "default", CONFIG).room == 2
    mixed = fresh(waiting=1, inflight=12, admitted_since_scrape=3, plain_since_scrape=1)
    assert mixed.queue_estimate == 2  # the plain one counts; both streamed ones started


def test_jobs_the_scrape_could_not_show_add_to_what_it_showed() -> None:
    # A job dispatched before the scrape and handed to the engine after it (or just before,
    # within the engine's metrics lag) is in neither the sample nor "sent since": the count
    # read at the scrape keeps it in the estimate.
    state = fresh(waiting=2, running=10, inflight=14, unstarted=1, unseen_at_scrape=1)
    assert state.queue_estimate == 3
    assert METRICS.decide(state, "default", CONFIG).room_for_served == 0
    sent_too = fresh(
        waiting=1, inflight=14, unseen_at_scrape=1, admitted_since_scrape=1, plain_since_scrape=1
    )
    assert sent_too.queue_estimate == 3


def test_streamed_jobs_handed_over_before_the_scrape_count_until_their_first_token() -> None:
    # The measured case: a burst handed over just before a scrape held a
    # band for the whole scrape interval after the jobs had started.
    burst = fresh(waiting=1, running=10, inflight=13, unseen_streamed=2, unstarted=2)
    assert burst.queue_estimate == 3
    assert METRICS.decide(burst, "default", CONFIG).room_for_served == 0
    started = fresh(waiting=1, running=12, inflight=13, unseen_streamed=2, unstarted=0)
    assert started.queue_estimate == 1
    assert METRICS.decide(started, "default", CONFIG).room == 2


def test_one_lag_free_count_bounds_streamed_jobs_handed_before_and_sent_after_the_scrape() -> None:
    # Every one of them that may still wait is unstarted: together at most that count.
    state = fresh(unseen_streamed=2, admitted_since_scrape=2, unstarted=3, inflight=4)
    assert state.queue_estimate == 3
    plain_too = fresh(unseen_at_scrape=1, unseen_streamed=2, unstarted=1, inflight=3)
    assert plain_too.queue_estimate == 2  # the held one counts whatever has started


def test_only_jobs_the_scrape_did_not_show_holding_a_band_back_asks_for_an_early_scrape() -> None:
    held = fresh(waiting=0, running=20, inflight=21, admitted_since_scrape=1, plain_since_scrape=1)
    assert METRICS.decide(held, "batch", CONFIG).room == 0
    assert held_by_unseen(held, "batch", CONFIG)
    # Jobs on their way or handed over just before the scrape: a newer one may show them.
    plain = fresh(waiting=1, running=20, inflight=22, unseen_at_scrape=2)
    assert METRICS.decide(plain, "default", CONFIG).room_for_served == 0
    assert held_by_unseen(plain, "default", CONFIG)
    streamed = fresh(waiting=1, inflight=2, unseen_streamed=2, unstarted=2)
    assert held_by_unseen(streamed, "default", CONFIG)
    # The engine's own queue or the lag-free count hold it: a new scrape cannot open it.
    assert not held_by_unseen(fresh(waiting=1, admitted_since_scrape=1), "batch", CONFIG)
    assert not held_by_unseen(fresh(waiting=3, unseen_at_scrape=1), "default", CONFIG)
    lag_free = fresh(unstarted=3, unseen_streamed=3, inflight=3)
    assert not held_by_unseen(lag_free, "default", CONFIG)
    # Room left, nothing unseen, or metrics not to be trusted: no early scrape either.
    assert not held_by_unseen(fresh(unseen_at_scrape=1), "default", CONFIG)
    assert not held_by_unseen(fresh(waiting=1), "batch", CONFIG)
    stale = fresh(fresh=False, admitted_since_scrape=1)
    assert not held_by_unseen(stale, "batch", CONFIG)


def test_the_lag_free_count_of_unstarted_jobs_wins_when_larger() -> None:
    state = fresh(waiting=0, running=0, inflight=3, unstarted=3)  # sent, engine shows nothing yet
    assert state.queue_estimate == 3
    assert METRICS.decide(state, "default", CONFIG).room_for_served == 0


def test_batch_is_admitted_only_when_the_engine_queue_is_empty() -> None:
    assert METRICS.decide(fresh(waiting=0, running=20, inflight=20), "batch", CONFIG).room == 1
    assert METRICS.decide(fresh(waiting=1, running=20, inflight=21), "batch", CONFIG).room == 0
    assert METRICS.decide(fresh(unstarted=1, inflight=1), "batch", CONFIG).room == 0


def test_a_slow_engine_over_the_tpot_ceiling_admits_nothing() -> None:
    slow = fresh(waiting=0, running=40, inflight=40, tpot_s=0.2)
    decision = METRICS.decide(slow, "interactive", CONFIG)
    assert decision.room == 0 and decision.limit is Limit.TPOT_CEILING
    assert METRICS.decide(fresh(running=40, inflight=40, tpot_s=0.1), "default", CONFIG).room == 3


def test_the_tpot_ceiling_cannot_deadlock_an_engine_with_nothing_running() -> None:
    idle_but_slow_history = fresh(waiting=0, running=0, inflight=0, tpot_s=0.5)
    assert METRICS.decide(idle_but_slow_history, "default", CONFIG).room == 3


def test_stale_or_missing_metrics_fall_back_to_the_static_inflight_cap() -> None:
    stale = EndpointState("http://a", inflight=5, fresh=False, waiting=0)
    decision = METRICS.decide(stale, "default", CONFIG)
    assert decision.room == 3 and decision.limit is Limit.STALE_METRICS
    full = EndpointState("http://a", inflight=8, fresh=False)
    assert METRICS.decide(full, "default", CONFIG).room == 0


def test_an_unhealthy_endpoint_receives_nothing() -> None:
    for policy in (METRICS, StaticCap()):
        decision = policy.decide(fresh(healthy=False), "interactive", CONFIG)
        assert decision.room == 0 and decision.limit is Limit.UNHEALTHY


def test_static_policy_is_the_inflight_cap_alone() -> None:
    assert StaticCap().decide(fresh(waiting=50, inflight=6), "default", CONFIG).room == 2


@pytest.mark.parametrize("name", sorted(ADMISSION))
def test_every_admission_policy_never_returns_negative_room(name: str) -> None:
    for state in (fresh(waiting=100, inflight=100), fresh(healthy=False), fresh(fresh=False)):
        for band in CONFIG.targets:
            assert ADMISSION[name].decide(state, band, CONFIG).room >= 0


def test_routing_prefers_most_room_then_least_waiting_then_least_running() -> None:
    a = fresh(endpoint="http://a", waiting=1, running=10)
    b = fresh(endpoint="http://b", waiting=0, running=30)
    c = fresh(endpoint="http://c", waiting=0, running=5)
    assert choose_endpoint(METRICS, [a, b, c], "default", CONFIG).endpoint == "http://c"  # type: ignore[union-attr]
    assert choose_endpoint(METRICS, [a, b], "default", CONFIG).endpoint == "http://b"  # type: ignore[union-attr]
    sick = fresh(endpoint="http://c", healthy=False)
    assert choose_endpoint(METRICS, [a, sick], "default", CONFIG).endpoint == "http://a"  # type: ignore[union-attr]


def test_no_endpoint_with_room_chooses_none_and_says_why() -> None:
    full = fresh(endpoint="http://a", waiting=3, running=10, inflight=13)
    sick = fresh(endpoint="http://b", healthy=False)
    assert choose_endpoint(METRICS, [full, sick], "default", CONFIG) is None
    assert refusals(METRICS, [full, sick], "default", CONFIG) == {
        "http://a": Limit.QUEUE_TARGET,
        "http://b": Limit.UNHEALTHY,
    }


def test_sends_before_the_scrape_count_through_its_unseen_count_and_later_ones_as_sent() -> None:
    from broker import ModelSnapshot, Unseen
    from dispatcher.endpoints import SentLog, endpoint_states
    from dispatcher.engine_metrics import EngineSample
    from dispatcher.scraper import EndpointView

    sent = SentLog(keep_s=10)
    sent.record("http://a", 1, now=98.0)  # long before the scrape: the engine shows it
    sent.record("http://a", 2, now=98.99)  # just before: still on their way (unseen)
    sent.record("http://a", 1, now=99.05, plain=1)  # after the scrape was sent
    sample = EngineSample(0, 0, None, None, None)
    view = EndpointView(sample, scraped_at=99.0, unseen=Unseen(2, 0), healthy=True)
    snap = ModelSnapshot([], {"http://a": 4}, {})
    (state,) = endpoint_states(["http://a"], snap, {"http://a": view}, sent, now=99.1, stale_s=2)
    assert state.admitted_since_scrape == 1 and state.unseen_at_scrape == 2
    assert METRICS.decide(state, "default", CONFIG).room_for_served == 0


BANDS = ("interactive", "default", "batch")


def test_an_idle_model_grants_each_band_its_room_on_the_emptiest_endpoint() -> None:
    busy, idle = fresh(endpoint="http://a", waiting=2), fresh(endpoint="http://b")
    grant = plan_grant(METRICS, [busy, idle], BANDS, CONFIG)
    assert grant is not None and grant.endpoint == "http://b"
    assert grant.credits == {"interactive": 3, "default": 3, "batch": 1}


def test_a_band_without_room_gets_no_credits_but_the_others_keep_theirs() -> None:
    grant = plan_grant(METRICS, [fresh(waiting=1, running=4, inflight=5)], BANDS, CONFIG)
    assert grant is not None and grant.credits == {"interactive": 2, "default": 2}


def test_no_room_anywhere_grants_nothing() -> None:
    full = fresh(waiting=3, running=30, inflight=33)
    assert plan_grant(METRICS, [full], BANDS, CONFIG) is None
    assert plan_grant(METRICS, [fresh(healthy=False)], BANDS, CONFIG) is None
    slow = fresh(running=4, inflight=4, tpot_s=0.5)
    assert plan_grant(METRICS, [slow], BANDS, CONFIG) is None


def test_stale_metrics_grant_only_the_static_caps_room() -> None:
    grant = plan_grant(METRICS, [fresh(fresh=False, inflight=6)], BANDS, CONFIG)
    assert grant is not None and grant.credits == {b: 2 for b in BANDS}


# --- the engine's batch: free slots for users in the engine, kept slots for newcomers -------

BATCH8 = AdmissionConfig(
    targets={"interactive": 3, "default": 3, "batch": 1}, tpot_ceiling_s=0.150, inflight_cap=8,
    batch_slots=8, reserved_slots=1,
)  # fmt: skip


def test_a_full_batch_admits_only_users_with_nothing_in_the_engine() -> None:
    # 8 slots, one kept: the flood's 7 fill the rest.
    full = METRICS.decide(fresh(running=7, inflight=7), "interactive", BATCH8)
    assert full.room == 3 and full.served_room == 0 and full.limit is Limit.BATCH_SLOTS
    # A user already in the engine gets only free slots, never its queue.
    open_ = METRICS.decide(fresh(running=5, inflight=5), "interactive", BATCH8)
    assert open_.served_room == 2 and open_.room_for_served == 2


def test_refills_waiting_for_their_prefill_hold_back_users_in_the_engine() -> None:
    # Slots are free, but two of the flood's jobs wait for their prefill: with one place
    # of the target left to newcomers, users already in the engine get nothing more.
    waiting = METRICS.decide(fresh(running=3, inflight=5, unstarted=2), "interactive", BATCH8)
    assert waiting.room > 0 and waiting.served_room == 0
    assert waiting.limit is Limit.REFILLS_WAITING


def test_newcomers_are_still_bounded_by_the_engine_queue_target() -> None:
    # The batch is over-full with newcomers waiting at the head of the engine's queue.
    decision = METRICS.decide(fresh(running=8, waiting=3, inflight=11), "default", BATCH8)
    assert decision.room == 0 and decision.served_room == 0


def test_free_slots_never_exceed_the_queue_target_room() -> None:
    decision = METRICS.decide(fresh(running=0, inflight=0, unstarted=1), "default", BATCH8)
    assert decision.room == 2 and decision.served_room == 1


def test_users_in_the_engine_leave_a_place_of_the_queue_target_to_newcomers() -> None:
    # Two refills of the flood wait for their prefill: a third would fill the target and
    # hold a newcomer back a step, although a kept slot is free for it.
    refilled = fresh(running=4, inflight=6, unstarted=2)  # a slot free beside the kept one
    decision = METRICS.decide(refilled, "default", BATCH8)
    assert decision.room == 1 and decision.served_room == 0
    # Without kept slots (a small batch) the flood may fill the target: newcomers get the
    # head of the engine's queue by preemption instead.
    none_kept = AdmissionConfig(
        targets={"default": 3}, tpot_ceiling_s=1, inflight_cap=8, batch_slots=8,
        reserved_slots=0,
    )  # fmt: skip
    assert METRICS.decide(refilled, "default", none_kept).served_room == 1
    # The place is counted lag-free: non-streamed jobs sent since the scrape (the scrape's
    # caution) hold the flood back only as far as they did, so it still fills its batch.
    plain = fresh(running=4, inflight=5, admitted_since_scrape=1, plain_since_scrape=1)
    assert METRICS.decide(plain, "default", BATCH8).served_room == 2
    # A target of one (the batch band) is all the flood's: no place is left to split.
    one = AdmissionConfig(targets={"batch": 1}, tpot_ceiling_s=1, inflight_cap=8,
                          batch_slots=8, reserved_slots=1)  # fmt: skip
    assert METRICS.decide(fresh(running=5, inflight=5), "batch", one).served_room == 1


def test_refills_the_end_rate_keeps_starting_are_no_queue_ahead_of_a_newcomer() -> None:
    # A 256-slot batch of short answers ends about four requests per start window: four of
    # the flood's refills on their way or in their prefill step are not a queue; the
    # newcomer joins their step. Counted as one, they took the whole target: the flood
    # could keep only two starting, and its batch shrank.
    big = AdmissionConfig(
        targets={"default": 3}, tpot_ceiling_s=1, inflight_cap=8, batch_slots=256,
        reserved_slots=8,
    )  # fmt: skip
    starting = fresh(running=240, inflight=244, unstarted=4)
    assert METRICS.decide(starting, "default", big).served_room == 0  # none known to end
    ends = replace(starting, starting_refills=3.9)
    decision = METRICS.decide(ends, "default", big)
    assert decision.room == 2 and decision.served_room == 1
    assert decision.queue_estimate == pytest.approx(0.1)
    # Beyond them, refills wait for the engine: they hold the flood and the newcomer back.
    crowded = replace(ends, inflight=247, unstarted=7)
    decision = METRICS.decide(crowded, "default", big)
    assert decision.room == 0 and decision.served_room == 0
    # And jobs beyond the batch are a queue however fast it ends.
    beyond = replace(ends, inflight=259, unstarted=0)
    assert METRICS.decide(beyond, "default", big).room == 0


@pytest.mark.parametrize(
    ("batch", "reserved", "kept"),
    [(256, None, 1), (63, None, 1), (32, None, 1), (31, None, 0), (8, None, 0), (256, 0, 0),
     (4, 10, 3)],
)  # fmt: skip
def test_one_slot_is_kept_from_32_slots_up_and_never_the_whole_batch(
    batch: int, reserved: int | None, kept: int
) -> None:
    config = AdmissionConfig(targets={}, tpot_ceiling_s=1, inflight_cap=1, reserved_slots=reserved)
    assert config.reserve(batch) == kept


def test_the_batch_is_learned_from_metrics_unless_configured_or_turned_off() -> None:
    learned = AdmissionConfig(
        targets={"default": 3}, tpot_ceiling_s=1, inflight_cap=8, reserved_slots=1
    )
    state = fresh(running=7, inflight=7, batch_seen=8)
    assert METRICS.decide(state, "default", learned).served_room == 0
    # Not learned yet: users in the engine fill the target (the engine is soon seen full).
    assert METRICS.decide(fresh(running=7, inflight=7), "default", learned).served_room == 3
    off = AdmissionConfig(targets={"default": 3}, tpot_ceiling_s=1, inflight_cap=8, batch_slots=0)
    assert METRICS.decide(state, "default", off).served_room is None


def test_while_the_capacity_is_learned_a_newcomer_always_goes() -> None:
    # A flood's jobs fill the target (three prefilling), the engine not seen full yet: a
    # newcomer gets a place beyond it, users in the engine nothing.
    ramping = fresh(running=10, inflight=13, unstarted=3)
    decision = METRICS.decide(ramping, "default", CONFIG)
    assert (decision.room, decision.room_for_served) == (1, 0)
    assert decision.limit is Limit.REFILLS_WAITING
    # Bounded: not while the engine's own queue is at the target, nor past twice it.
    assert METRICS.decide(replace(ramping, waiting=3), "default", CONFIG).room == 0
    assert METRICS.decide(replace(ramping, unstarted=6, inflight=16), "default", CONFIG).room == 0
    # Below the target users in the engine take it all, as newcomers do.
    one = METRICS.decide(replace(ramping, unstarted=1, inflight=11), "default", CONFIG)
    assert (one.room, one.room_for_served) == (2, 2)
    # A target of one is first come as before.
    batch_band = METRICS.decide(fresh(running=4, inflight=4), "batch", CONFIG)
    assert batch_band.served_room is None


def test_routing_prefers_free_batch_slots_over_queue_room() -> None:
    # Both have queue room for newcomers; only one has a batch slot for the rest.
    full = fresh(endpoint="http://full", running=7, inflight=7)
    free = fresh(endpoint="http://free", running=6, inflight=6, unstarted=1)
    decision = choose_endpoint(METRICS, [full, free], "default", BATCH8)
    assert decision is not None and decision.endpoint == "http://free"


def test_the_express_grant_carries_the_free_slots_for_users_in_the_engine() -> None:
    grant = plan_grant(METRICS, [fresh(running=6, inflight=6)], ["interactive", "batch"], BATCH8)
    assert (
        grant is not None and grant.served == 1 and grant.credits == {"interactive": 3, "batch": 1}
    )
    unknown = plan_grant(METRICS, [fresh()], ["interactive"], CONFIG)
    assert unknown is not None and unknown.served == 3  # the whole target while learning


def test_with_the_batch_known_the_engine_queue_is_counted_lag_free() -> None:
    # A non-streamed job sent since the last scrape went into a free slot: it does not
    # hold a newcomer back until the next scrape, as it must without the batch.
    state = fresh(running=5, inflight=6, admitted_since_scrape=3, plain_since_scrape=3)
    assert METRICS.decide(state, "interactive", CONFIG).room_for_served == 0
    assert METRICS.decide(state, "interactive", BATCH8).room == 3
    # fairq's jobs beyond the batch wait in the engine: they are its queue.
    beyond = fresh(running=8, inflight=10, admitted_since_scrape=2, plain_since_scrape=2)
    assert METRICS.decide(beyond, "interactive", BATCH8).room == 1
    # Users already in the engine are still held by those sends until a scrape shows them:
    # the dispatcher asks for that scrape early, as without the batch.
    assert METRICS.decide(state, "interactive", BATCH8).served_room == 0
    assert held_by_unseen(state, "interactive", BATCH8)


def test_a_kv_bound_engine_takes_only_what_it_runs() -> None:
    # 8 slots, but the KV cache is full at 5 running and 2 wait: the batch is 5 for now.
    kv_full = fresh(running=5, waiting=2, inflight=7, kv_usage=0.97)
    assert BATCH8.room_in(kv_full) == 5
    decision = METRICS.decide(kv_full, "default", BATCH8)
    assert decision.served_room == 0 and decision.queue_estimate == 2
    assert BATCH8.room_in(fresh(running=5, waiting=0, inflight=5, kv_usage=0.97)) == 8
    # Waiting with KV room left: for a step's prefill budget, not for a slot.
    assert BATCH8.room_in(fresh(running=5, waiting=2, inflight=7, kv_usage=0.4)) == 8


def test_users_in_the_engine_keep_the_scrapes_caution_and_newcomers_do_not() -> None:
    # Three non-streamed jobs sent since the scrape may wait for prefill budget: no more
    # for users already in the engine until the next scrape shows them, but a newcomer goes.
    state = fresh(running=4, inflight=7, admitted_since_scrape=3, plain_since_scrape=3)
    decision = METRICS.decide(state, "interactive", BATCH8)
    assert decision.room == 3 and decision.served_room == 0


def test_with_preemption_one_job_waits_beyond_the_batch_to_hide_the_refill() -> None:
    ahead = AdmissionConfig(
        targets={"default": 3}, tpot_ceiling_s=1, inflight_cap=8, batch_slots=8,
        reserved_slots=0, refill_ahead=1,
    )  # fmt: skip
    assert METRICS.decide(fresh(running=8, inflight=8), "default", ahead).served_room == 1
    assert METRICS.decide(fresh(running=8, inflight=9), "default", ahead).served_room == 0


def test_a_newcomer_is_held_by_the_reported_queue_only_beyond_what_fairq_put_there() -> None:
    # Two of the flood's non-streamed jobs wait for prefill budget: not a newcomer's wait.
    assert METRICS.decide(fresh(running=6, waiting=2, inflight=8), "default", BATCH8).room == 3
    # Twelve waiting: more than fairq's targets allow; the engine's batch is smaller.
    assert METRICS.decide(fresh(running=6, waiting=12, inflight=8), "default", BATCH8).room == 0


def test_started_jobs_the_engine_put_back_in_its_queue_are_fairqs_not_a_newcomers_wait() -> None:
    # KV cache full: the scrape saw 42 of fairq's jobs there, 33 running and 9 waiting
    # (started, put back). Nine have been taken back since: the engine's queue is fairq's
    # own, counted lag-free, and a newcomer goes before the next scrape shows it empty.
    scrape = {"running": 33, "waiting": 9, "kv_usage": 0.98, "batch_seen": 38, "full_at": 33}
    after = fresh(inflight=33, shown_at_scrape=42, **scrape)
    assert after.waiting_others == 0 and after.waiting_beyond == 9
    assert METRICS.decide(after, "default", CONFIG).room == 3
    # Without the jobs it showed, nine waiting is more than fairq put there.
    assert METRICS.decide(fresh(inflight=33, **scrape), "default", CONFIG).room == 0


@pytest.mark.parametrize(
    ("limit", "counted"),
    [
        (Limit.REFILLS_WAITING, Limit.REFILLS_WAITING),
        (Limit.REFILL_PACE, Limit.REFILL_PACE),
        (Limit.NEWCOMER_STEP, Limit.NEWCOMER_STEP),
        (Limit.BATCH_SLOTS, Limit.BATCH_SLOTS),
        (Limit.QUEUE_TARGET, Limit.BATCH_SLOTS),  # room, none for users in the engine
    ],
)
def test_a_round_that_held_users_in_the_engine_counts_why(limit: Limit, counted: Limit) -> None:
    assert _held(Decision("http://a", 3, limit, served_room=0)) is counted


def test_a_running_set_seen_full_below_the_slots_bounds_the_batch_only_with_the_cache_used() -> (
    None
):
    # 64 slots, requests seen waiting at 61 running twice: with 18% of the KV cache used
    # they waited for something else than room (a prefill budget), so the batch stays 64.
    learned = {"batch_seen": 64, "full_at": 61, "running": 61.0, "inflight": 61}
    assert CONFIG.room_in(fresh(kv_usage=0.18, **learned)) == 64
    assert CONFIG.room_in(fresh(kv_usage=0.7, **learned)) == 61  # the KV cache's bound
    assert CONFIG.room_in(fresh(**learned)) == 61  # an engine that does not say its KV use
