"""The take-back stage while an engine's capacity is still learned (dispatcher.preemption):
for a newcomer sent in this round, the running set of a fresh scrape that found requests
waiting stands for the batch; a newcomer carried on from an earlier round takes nothing."""

from __future__ import annotations

from redis.asyncio import Redis

from broker import DispatchStore, ExecutionStore, JobQueue, JobState, Pick
from dispatcher.admission import AdmissionConfig, EndpointState
from dispatcher.preemption import Preemption, RoundEnd, may_wait_behind, room_for_take_back
from tests.support.contract import EP, MODEL, settings, submission

LEARNED = AdmissionConfig(  # batch_slots None: learned from the engine's metrics
    targets={"interactive": 3, "default": 3, "batch": 1}, tpot_ceiling_s=1.0, inflight_cap=8,
)  # fmt: skip
TOLD = AdmissionConfig(
    targets={"interactive": 3, "default": 3, "batch": 1}, tpot_ceiling_s=1.0, inflight_cap=8,
    batch_slots=6,
)  # fmt: skip


def ramp(**fields: object) -> EndpointState:
    """An engine whose last scrape, recent, found 4 running and 2 waiting; 7 of fairq's
    jobs are there (one a newcomer's), the capacity not yet known."""
    values: dict[str, object] = {"inflight": 7, "unstarted": 3, "fresh": True, "running": 4.0}
    values["waiting"] = 2.0
    values.update(fields)
    return EndpointState(EP, **values)  # type: ignore[arg-type]


def test_a_newcomer_sent_now_counts_the_scrapes_running_set_as_the_batch() -> None:
    assert room_for_take_back(LEARNED, ramp(), fresh=1) == 4


def test_nothing_stands_for_the_batch_without_a_newcomer_of_this_round() -> None:
    assert room_for_take_back(LEARNED, ramp(), fresh=0) is None


def test_a_scrape_that_found_nothing_waiting_or_is_stale_says_nothing() -> None:
    assert room_for_take_back(LEARNED, ramp(waiting=0.0), fresh=1) is None
    assert room_for_take_back(LEARNED, ramp(running=0.0), fresh=1) is None
    assert room_for_take_back(LEARNED, ramp(fresh=False), fresh=1) is None


def test_a_known_batch_is_the_batch_whoever_was_sent() -> None:
    assert room_for_take_back(TOLD, ramp(), fresh=0) == 6
    assert room_for_take_back(TOLD, ramp(), fresh=1) == 6
    learned = ramp(batch_seen=5)
    assert room_for_take_back(LEARNED, learned, fresh=1) == 5


async def _flood(q: JobQueue, d: DispatchStore, count: int) -> list[str]:
    jobs = [await q.submit(submission("alice")) for _ in range(count)]
    picks = [Pick("default", "alice", 1 + i, 0.5 + i) for i in range(count)]
    assert len((await d.dispatch(MODEL, EP, 20, picks, 20)).ids) == count
    return jobs


async def test_jobs_beyond_the_running_set_go_back_once_for_a_newcomer_of_this_round(
    r: Redis,
) -> None:
    s = settings(model_fields={"preemption": True})
    q, d = JobQueue(r, s), DispatchStore(r, s)
    await ExecutionStore(r, s).ensure_groups([MODEL])
    flood = await _flood(q, d, 6)
    model = s.model(MODEL)
    assert model is not None
    snap = await d.snapshot(MODEL, 10, in_engine=True)
    state = ramp(inflight=6, unstarted=6)
    preemption = Preemption(d, {MODEL: [model]}, {})
    carried = RoundEnd(model, snap, [state], LEARNED, {EP: 1}, carried={EP: 1})
    assert await preemption.make_room(carried) == set()  # carried on: no churn each round
    fresh = RoundEnd(model, snap, [state], LEARNED, {EP: 1})
    assert await preemption.make_room(fresh) == {MODEL}
    states = [(await q.get(job, "alice")).state for job in flood]
    # The two beyond the scrape's running set, the newest: those ahead of the newcomer.
    assert states == [JobState.DISPATCHED] * 4 + [JobState.QUEUED] * 2


def test_a_newcomer_is_carried_while_fairqs_jobs_may_still_wait_ahead_of_it() -> None:
    assert may_wait_behind(ramp(), batch=None)  # the capacity not known yet
    assert may_wait_behind(ramp(inflight=7), batch=6)  # one beyond the batch
    settled = ramp(inflight=6, unstarted=0, running=6.0, waiting=0.0, shown_at_scrape=6)
    assert not may_wait_behind(settled, batch=6)
    # KV cache full: the engine preempted one of fairq's started jobs into its queue (7
    # shown, 6 running, none without a first token), ahead of the newcomer sent since.
    put_back = ramp(inflight=6, unstarted=0, running=6.0, waiting=1.0, shown_at_scrape=7)
    assert put_back.put_back == 1 and may_wait_behind(put_back, batch=6)
    # Waiting that is fairq's unstarted jobs, or other clients', is not a put-back.
    assert ramp(running=4.0, waiting=2.0, shown_at_scrape=7, unstarted_at_scrape=3).put_back == 0
    assert ramp(running=4.0, waiting=5.0, shown_at_scrape=4).put_back == 0
