"""The simulator's steps keep to their modeled timeline while its event loop wakes late
(it streams every token from the same loop, and a busy machine delays it): a short stall
is made up by the next steps, a long one is lost and counted (``sim._engine``).
In-process: the engine loop runs as a task, and the test blocks that loop on purpose."""

from __future__ import annotations

import asyncio
import time

from sim._engine import CATCH_UP_S, Engine, SimSequence, engine_running
from sim._metrics import SimMetrics
from sim._profile import SimProfile

MODEL = "m"
STEP_S = 0.02
STEPS = 30  # a 30-token answer: its prefill step gives the first token, 29 decode steps
LOST = "fairq_sim_step_overrun_seconds_total"


async def answer_with_a_stall(stall_s: float) -> tuple[float, float]:
    """The wall time of one answer while the loop is blocked ``stall_s`` once, mid-answer,
    and the time the engine counted as lost."""
    profile = SimProfile(step_base_ms=STEP_S * 1000, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
    metrics = SimMetrics([MODEL])
    engine = Engine(profile, metrics)
    async with engine_running(engine):
        started = time.monotonic()
        seq: SimSequence = engine.submit(MODEL, 8, STEPS, "length", streamed=False)
        await asyncio.sleep(STEP_S * 5)
        time.sleep(stall_s)  # the loop blocked: no step ends meanwhile
        while not seq.done:
            await seq.wakeup.wait()
            seq.wakeup.clear()
        elapsed = time.monotonic() - started
    return elapsed, metrics.registry.get_sample_value(LOST) or 0.0


async def test_a_stall_shorter_than_the_catch_up_is_made_up_by_the_next_steps() -> None:
    stall = CATCH_UP_S * 0.8
    elapsed, lost = await answer_with_a_stall(stall)
    # Without the timeline the answer would take its steps plus the stall (0.68 s).
    assert elapsed < STEPS * STEP_S + stall / 2
    assert lost == 0.0


async def test_a_longer_stall_is_lost_and_counted() -> None:
    stall = CATCH_UP_S * 3
    elapsed, lost = await answer_with_a_stall(stall)
    assert elapsed >= STEPS * STEP_S + stall - CATCH_UP_S
    assert stall - STEP_S <= lost <= stall + CATCH_UP_S
