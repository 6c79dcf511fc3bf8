"""Refills paced by the engine's step (dispatcher.pacing): hand-made cases."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import fakeredis
import pytest

from broker import ModelConfig
from broker.dispatching import ModelSnapshot
from dispatcher.admission import (
    AdmissionConfig,
    Decision,
    EndpointState,
    Limit,
    MetricsAdmission,
)
from dispatcher.endpoints import SentLog, endpoint_states
from dispatcher.engine_metrics import PACE_WINDOW_S, EngineSample, PaceWindow, next_pace_window
from dispatcher.newcomer_step import NewcomerSteps
from dispatcher.pacing import (
    Pace,
    PacedRefills,
    Pacer,
    RefillPace,
    UnpacedRefills,
    pace_of,
    starting_refills,
)
from dispatcher.preemption import Preemption
from dispatcher.scraper import EndpointView
from dispatcher.service import Dispatcher
from dispatcher.stages import Shared, build
from dispatcher.wake import WakeListener
from tests.support.settings import MODEL, make_settings

METRICS = MetricsAdmission()
NO_PREEMPTION = Preemption(None, {}, {})  # type: ignore[arg-type]  # never called here
# 64 slots, 2 kept for newcomers; an engine step of 50 ms
PACED = AdmissionConfig(
    targets={"interactive": 3, "default": 3, "batch": 1}, tpot_ceiling_s=0.150, inflight_cap=8,
    batch_slots=64, reserved_slots=2,
)  # fmt: skip


def state(**values: object) -> EndpointState:
    base: dict[str, object] = {
        "endpoint": "http://a", "inflight": 40, "running": 40, "fresh": True, "pace_allowed": 1,
    }  # fmt: skip
    return EndpointState(**(base | values))  # type: ignore[arg-type]


def window(ends_per_s: float | None, step_s: float | None) -> PaceWindow:
    return PaceWindow(0.0, 0.0, None, ends_per_s, step_s)


def test_the_refills_starting_at_once_are_the_end_rate_over_the_start_window() -> None:
    # 23 ends/s, steps of 56 ms: a start window of three steps holds 3.9 refills.
    assert starting_refills(window(23.0, 0.056)) == pytest.approx(23 * 0.168)
    # Short steps: the window's floor (50 ms) bounds it.
    assert starting_refills(window(10.0, 0.005)) == pytest.approx(0.5)
    # No end rate or step known yet: none are counted as starting.
    assert starting_refills(window(None, 0.05)) == 0.0
    assert starting_refills(window(5.0, None)) == 0.0
    assert starting_refills(None) == 0.0


def test_the_pace_is_one_refill_a_step_more_than_requests_end_in_one() -> None:
    # 5 ends/s x 50 ms = 0.25 per step: 1.25 refills a step, one every 40 ms.
    slow = pace_of(window(5.0, 0.05))
    assert slow == Pace(1.25, 0.05) and slow.interval_s == pytest.approx(0.04)
    assert slow.per_step == 2
    # 90 ends/s x 50 ms = 4.5 per step: 5.5 refills a step, one every 9 ms, at most six at
    # once -- not four a step, at which the batch would shrink until only four ended in
    # one, nor the end rate alone, at which a batch with free slots never grew.
    fast = pace_of(window(90.0, 0.05))
    assert fast is not None and fast.per_step == 6
    assert fast.interval_s == pytest.approx(0.05 / 5.5)
    assert pace_of(window(0.0, 0.05)) == Pace(1, 0.05)  # nothing ended yet: one per step
    assert pace_of(window(None, 0.05)) is None  # its first second: no whole window yet
    assert pace_of(window(5.0, None)) is None  # no token in the window
    assert pace_of(None) is None  # the engine does not count its ended requests


def test_paced_refills_go_one_interval_apart_and_a_late_send_does_not_push_the_rest() -> None:
    pacer, pace = Pacer(), Pace(1, 0.05)
    assert pacer.allowed("a", pace, 10.0) == 1 and pacer.due_in("a", 10.0) is None
    pacer.sent("a", 1, pace, 10.0)
    assert pacer.allowed("a", pace, 10.049) == 0
    assert pacer.due_in("a", 10.02) == pytest.approx(0.03)
    # Sent 10 ms late: the next is still due on the schedule, at 10.10, not at 10.11.
    assert pacer.allowed("a", pace, 10.06) == 1
    pacer.sent("a", 1, pace, 10.06)
    assert pacer.due_in("a", 10.06) == pytest.approx(0.04)
    # Nothing sent for more than a step: the schedule starts afresh, with no catching up.
    assert pacer.allowed("a", pace, 10.5) == 1
    pacer.sent("a", 1, pace, 10.5)
    assert pacer.due_in("a", 10.5) == pytest.approx(0.05)
    pacer.forget("a")
    assert pacer.due_in("a", 10.5) is None


def test_several_refills_per_step_are_spread_over_it_and_never_more_than_a_step_at_once() -> None:
    pacer, pace = Pacer(), Pace(4, 0.04)  # one every 10 ms
    assert pacer.allowed("a", pace, 0.0) == 4  # none sent yet: a step's worth
    pacer.sent("a", 1, pace, 0.0)
    assert pacer.allowed("a", pace, 0.005) == 0
    assert pacer.allowed("a", pace, 0.021) == 2  # 11 ms late: that one and the next
    assert pacer.allowed("a", pace, 0.05) == 4  # a step late: capped at a step's worth
    pacer.sent("a", 2, pace, 0.021)
    assert pacer.due_in("a", 0.021) == pytest.approx(0.009)  # due at 30 ms


def test_a_burst_sent_unpaced_holds_later_refills_back_a_step_at_most() -> None:
    # 300 refills went at once while the batch grew to a capacity not learned yet: at the
    # pace (one a step) they would hold refills back for 300 steps; their prefill takes
    # one long step.
    pacer, pace = Pacer(), Pace(1, 0.05)
    pacer.sent("a", 300, pace, 10.0)
    assert pacer.due_in("a", 10.0) == pytest.approx(0.05)
    assert pacer.allowed("a", pace, 10.05) == 1


def test_admission_sends_users_in_the_engine_what_the_pace_allows() -> None:
    first = METRICS.decide(state(), "default", PACED)
    assert first.served_room == 1 and first.limit is Limit.QUEUE_TARGET
    held = METRICS.decide(state(pace_allowed=0), "default", PACED)
    assert held.served_room == 0 and held.limit is Limit.REFILL_PACE
    assert held.room == first.room == 3  # a newcomer still goes at once
    # The pace only ever lowers the room: the queue target still bounds it.
    assert METRICS.decide(state(pace_allowed=4), "default", PACED).served_room == 2


def test_while_the_capacity_is_learned_users_in_the_engine_go_at_no_pace() -> None:
    # The pace follows the requests that end: a batch that only replaced those would never
    # grow to be seen full, and its capacity never be learned.
    learning = replace(PACED, batch_slots=None)
    decision = METRICS.decide(state(pace_allowed=0), "default", learning)
    assert decision.served_room == 3 and decision.limit is Limit.QUEUE_TARGET
    # Once it is known, the pace holds them.
    known = METRICS.decide(state(pace_allowed=0, batch_seen=64), "default", learning)
    assert known.served_room == 0 and known.limit is Limit.REFILL_PACE


def test_paced_users_in_the_engine_keep_the_scrapes_caution_too() -> None:
    # Two non-streamed jobs sent since the scrape may wait unseen: one more of the three,
    # paced or not.
    unseen = state(pace_allowed=None, admitted_since_scrape=2, plain_since_scrape=2)
    assert METRICS.decide(unseen, "default", PACED).served_room == 1
    assert METRICS.decide(replace(unseen, pace_allowed=4), "default", PACED).served_room == 1
    # Not paced (the stage off: no pace in the state): the target alone bounds them.
    decision = METRICS.decide(state(pace_allowed=None), "default", PACED)
    assert decision.served_room == 2 and decision.limit is Limit.QUEUE_TARGET


def test_the_model_setting_chooses_the_paced_stage_by_default() -> None:
    model = ModelConfig(name="m", endpoints=("http://a",))
    shared = Shared(NewcomerSteps(), Pacer(), NO_PREEMPTION)
    assert isinstance(build(model, ("default",), shared).pace, PacedRefills)
    off = model.model_copy(update={"pace_refills": False})
    assert isinstance(build(off, ("default",), shared).pace, UnpacedRefills)
    # The pace tells newcomers from users in the engine: without the batch rule, off.
    no_batch = model.model_copy(update={"batch_slots": 0})
    assert isinstance(build(no_batch, ("default",), shared).pace, UnpacedRefills)


def sample(ended: float | None, tpot: tuple[float, float] = (0.0, 0.0)) -> EngineSample:
    return EngineSample(waiting=0, running=8, kv_usage=None, tpot_sum_s=tpot[0],
                        tpot_count=tpot[1], e2e_count=ended)  # fmt: skip


def test_the_ends_rate_and_the_step_are_taken_over_windows_of_at_least_a_second() -> None:
    window = next_pace_window(None, sample(100, (5.0, 100)), at=10.0)
    assert window == PaceWindow(10.0, 100, (5.0, 100)) and window.ends_per_s is None
    # Scrapes within the window keep it: one request more or less is no rate.
    half = next_pace_window(window, sample(103, (6.0, 110)), at=10.0 + PACE_WINDOW_S / 2)
    assert half is window
    later = next_pace_window(window, sample(124, (9.0, 180)), at=10.0 + 2 * PACE_WINDOW_S)
    assert later is not None and later.ends_per_s == pytest.approx(24 / (2 * PACE_WINDOW_S))
    assert later.step_s == pytest.approx(4.0 / 80)  # 4 s of per-token time over 80 tokens
    assert later.start_ended == 124 and later.start_tpot == (9.0, 180)
    # No token in the window: no step.
    idle = next_pace_window(later, sample(124, (9.0, 180)), at=20.0)
    assert idle is not None and idle.ends_per_s == 0.0 and idle.step_s is None
    # The engine restarted (its count went back): a new window, no figures until it ends.
    assert next_pace_window(later, sample(3), at=20.0) == PaceWindow(20.0, 3, (0.0, 0.0))
    assert next_pace_window(later, sample(None), at=20.0) is None


def test_an_endpoints_state_carries_its_pace_from_the_engines_window_and_the_pacer() -> None:
    pacer = Pacer()
    window = PaceWindow(9.0, 50, (1.0, 20), ends_per_s=30.0, step_s=0.05)
    view = EndpointView(sample=sample(80), scraped_at=9.8, tpot_s=0.2, healthy=True, pace=window)
    snap = ModelSnapshot([], {"http://a": 40}, {})
    on = PacedRefills(pacer)

    def of(view: EndpointView, paced: RefillPace = on) -> EndpointState:
        (got,) = endpoint_states(
            ["http://a"], snap, {"http://a": view}, SentLog(4.0), now=10.0, stale_s=2.0,
            pace=paced,
        )  # fmt: skip
        return got

    # 30 ends/s x 50 ms: 1.5 a step, and one more: at most 3 at once
    assert of(view).pace_allowed == 3 and of(view).pace_due_in_s is None
    pacer.sent("http://a", 1, Pace(1, 0.05), now=9.97)
    assert of(view).pace_allowed == 0 and of(view).pace_due_in_s == pytest.approx(0.02)
    no_step = replace(view, pace=replace(window, step_s=None))
    assert of(no_step).pace_allowed is None and of(no_step).pace_due_in_s is None
    assert of(view, paced=UnpacedRefills()).pace_allowed is None  # the stage off


async def test_refills_held_by_their_pace_wake_the_dispatcher_when_the_step_frees() -> None:
    settings = make_settings()
    redis = fakeredis.FakeAsyncRedis()
    dispatcher = Dispatcher(settings, redis)
    wake = WakeListener(redis, [MODEL])
    rounds = dispatcher._rounds[MODEL]
    rounds._env.event = wake.event
    event = wake.event(MODEL)
    held = [Decision("http://a", 3, Limit.REFILL_PACE, served_room=0)]
    states = [state(pace_allowed=0, pace_due_in_s=0.05)]
    rounds._wake_when_paced(held, states)
    rounds._wake_when_paced(held, states)  # one timer at a time
    assert rounds._pace_timer
    await asyncio.sleep(0.02)
    assert not event.is_set()  # the step has not passed
    await asyncio.wait_for(event.wait(), 1.0)
    assert not rounds._pace_timer
    # Not held by the pace (the batch is full): nothing to wake for.
    event.clear()
    full = [Decision("http://a", 3, Limit.BATCH_SLOTS, served_room=0)]
    rounds._wake_when_paced(full, states)
    assert not rounds._pace_timer
    await redis.aclose()
