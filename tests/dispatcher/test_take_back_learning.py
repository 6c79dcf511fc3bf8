"""The take-back stage while an engine's capacity is still learned (dispatcher.preemption):
for a newcomer sent in this round, the running set of a fresh scrape that found requests
waiting stands for the batch; a newcomer carried on from an earlier round takes nothing."""

from __future__ import annotations

from redis.asyncio import Redis

from broker import DispatchStore, ExecutionStore, JobQueue, JobState, Pick
from dispatcher.admission import AdmissionConfig, EndpointState
from dispatcher.preemption import Preemption, RoundEnd, room_for_take_back
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
