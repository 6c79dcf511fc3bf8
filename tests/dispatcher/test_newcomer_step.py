"""A newcomer's prefill step kept clear of refills (dispatcher.newcomer_step): hand-made cases."""

from __future__ import annotations

from dispatcher.admission import (
    AdmissionConfig,
    EndpointState,
    Limit,
    MetricsAdmission,
    plan_grant,
)
from dispatcher.newcomer_step import HOLD_STEPS, KeepStepClear, NewcomerSteps, NoStepHold

METRICS = MetricsAdmission()
BATCH8 = AdmissionConfig(
    targets={"interactive": 3, "default": 3, "batch": 1}, tpot_ceiling_s=0.150, inflight_cap=8,
    batch_slots=8, reserved_slots=1,
)  # fmt: skip


def state(**values: object) -> EndpointState:
    base: dict[str, object] = {"endpoint": "http://a", "inflight": 5, "running": 5, "fresh": True}
    return EndpointState(**(base | values))  # type: ignore[arg-type]


def test_a_step_is_kept_clear_for_two_engine_steps_after_the_newcomer_is_sent() -> None:
    steps = NewcomerSteps()
    assert HOLD_STEPS == 2.0 and steps.clearing(0.0) == frozenset()
    assert steps.hold("http://a", 0.05, now=10.0)  # held until 10.1
    assert steps.hold("http://b", 0.01, now=10.0)  # each endpoint on its own
    assert steps.clearing(10.05) == {"http://a"}
    assert steps.hold("http://a", 0.05, now=10.06)  # a second newcomer: its steps too
    assert steps.clearing(10.15) == {"http://a"}
    assert steps.clearing(10.16) == frozenset()


def test_newcomers_one_after_another_hold_an_endpoint_at_most_half_the_time() -> None:
    steps = NewcomerSteps()
    now = 0.0
    assert steps.hold("http://a", 0.05, now)
    held = []
    for i in range(1, 15):  # a newcomer every 20 ms would keep extending it
        now = i / 50
        held.append(steps.hold("http://a", 0.05, now))
    # The hold stopped growing at twice its length (0.2 s), then rests as long.
    assert held == [True] * 9 + [False] * 5
    assert steps.clearing(0.199) == {"http://a"} and steps.clearing(0.2) == frozenset()
    assert not steps.hold("http://a", 0.05, 0.39)
    assert steps.clearing(0.39) == frozenset()
    assert steps.hold("http://a", 0.05, 0.41)


def test_while_the_step_is_kept_clear_users_in_the_engine_get_no_room_but_newcomers_do() -> None:
    free = METRICS.decide(state(), "interactive", BATCH8)
    assert free.served_room == 2 and free.limit is Limit.QUEUE_TARGET
    held = METRICS.decide(state(newcomer_step=True), "interactive", BATCH8)
    assert held.room == free.room == 3
    assert held.served_room == 0 and held.limit is Limit.NEWCOMER_STEP
    # A batch already full for them says so, as before: the step adds nothing.
    full = METRICS.decide(state(inflight=7, running=7, newcomer_step=True), "default", BATCH8)
    assert full.served_room == 0 and full.limit is Limit.BATCH_SLOTS


def test_the_express_grant_has_no_served_credits_while_the_step_is_kept_clear() -> None:
    bands = ("interactive", "default", "batch")
    grant = plan_grant(METRICS, [state(newcomer_step=True)], bands, BATCH8)
    assert grant is not None and grant.served == 0 and grant.credits["interactive"] == 3
    grant = plan_grant(METRICS, [state()], bands, BATCH8)
    assert grant is not None and grant.served == 2


def test_a_round_with_a_newcomer_backlogged_sends_it_alone() -> None:
    flood_only = [("alice", 1.0)]
    with_newcomer = [("alice", 1.0), ("bob", 2.0)]
    kept = KeepStepClear(NewcomerSteps())
    assert not kept.holds_refills(flood_only, ["alice"])
    assert kept.holds_refills(with_newcomer, ["alice"])
    assert not NoStepHold().holds_refills(with_newcomer, ["alice"])  # the stage off


def test_the_kept_step_is_timed_by_the_engines_step_and_not_kept_without_one() -> None:
    holds = NewcomerSteps()
    kept = KeepStepClear(holds)
    kept.newcomer_sent("http://a", None, 10.0)  # no step known yet: nothing kept
    assert kept.clearing(10.0) == frozenset()
    kept.newcomer_sent("http://a", 0.05, 10.0)
    assert kept.clearing(10.05) == {"http://a"} and NoStepHold().clearing(10.05) == ()
