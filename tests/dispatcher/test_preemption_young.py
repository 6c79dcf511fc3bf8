"""Clearing a newcomer's prefill step (dispatcher.preemption, dispatcher.newcomer_step):
only refills handed over within the last engine step are taken back, against a real Redis."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from broker import DispatchStore, ExecutionStore, JobQueue, JobState, Pick
from dispatcher.admission import AdmissionConfig, EndpointState
from dispatcher.preemption import Preemption, RoundEnd
from tests.support.contract import EP, MODEL, settings, submission

STEP_S = 0.2  # the engine's recent time per output token, as the scraper reports it
CONFIG = AdmissionConfig(
    targets={"interactive": 3, "default": 3, "batch": 1}, tpot_ceiling_s=1.0, inflight_cap=8,
    batch_slots=8,
)  # fmt: skip


async def _send(q: JobQueue, d: DispatchStore, count: int, first: int) -> list[str]:
    jobs = [await q.submit(submission("alice")) for _ in range(count)]
    picks = [Pick("default", "alice", first + i, first + i - 0.5) for i in range(count)]
    assert len((await d.dispatch(MODEL, EP, 10, picks, 10)).ids) == count
    return jobs


async def test_a_newcomer_takes_back_refills_of_the_last_step_not_older_ones(r: Redis) -> None:
    # Three refills handed over 1.5 steps ago have most likely begun their prefill in the
    # step in progress, which the newcomer waits out anyway: taking them back would waste
    # it. The two handed over just now may still wait for the newcomer's step.
    s = settings(model_fields={"preemption": True})
    q, d = JobQueue(r, s), DispatchStore(r, s)
    await ExecutionStore(r, s).ensure_groups([MODEL])
    older = await _send(q, d, 3, first=1)
    await asyncio.sleep(1.5 * STEP_S)
    recent = await _send(q, d, 2, first=10)
    model = s.model(MODEL)
    assert model is not None
    snap = await d.snapshot(MODEL, 10, in_engine=True)
    state = EndpointState(
        EP, inflight=5, unstarted=5, fresh=True, running=5, tpot_s=STEP_S, newcomer_step=True
    )
    preemption = Preemption(d, {MODEL: [model]}, {})
    end = RoundEnd(model, snap, [state], CONFIG, {EP: 1})
    assert await preemption.make_room(end) == {MODEL}
    states = {job: (await q.get(job, "alice")).state for job in older + recent}
    assert [states[j] for j in recent] == [JobState.QUEUED] * 2
    assert JobState.QUEUED not in [states[j] for j in older]
