"""The engine loop: continuous batching over simulated time.

`Engine` wraps the pure `Scheduler` (`_scheduler.py`) with a clock, metrics
and wake-ups; one asyncio task steps it. Each step asks the scheduler for a
plan (which requests compute how many tokens), sleeps for the plan's simulated
duration, then applies it: requests that completed their outstanding tokens
emit one token each. So `vllm:num_requests_waiting` grows when requests arrive
faster than the batch, the token budget or the KV cache can take them.

The steps keep to a timeline: while busy, a step begins where the last one's modeled
time ended, not when the event loop got back to it. The loop also streams every token
to its clients, and on a busy machine it wakes late; a GPU's steps do not wait for its
host's event loop (vLLM streams from another process than its engine core's), so a
late wake-up is made up by the next steps rather than added to each. Up to
``CATCH_UP_S`` behind is made up; farther behind (the process starved for longer), the
timeline starts again from now and the gap is lost, counted in
``fairq_sim_step_overrun_seconds_total``.

Who owns a sequence: `submit` hands it to the scheduler's waiting queue; the
scheduler moves it to running, back to waiting when it is preempted, and to
FINISHED; `abort` (a client went away, or the app shuts down) may take it from
either queue at any time and frees its slot and KV blocks at once. A sequence
reaches FINISHED or ABORTED exactly once. The HTTP layer follows a sequence
through its `wakeup` event: a streamed one after every token, any one when it
ends, so a non-streamed request costs nothing per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sim._errors import EngineStopped
from sim._metrics import ModelMetrics, SimMetrics
from sim._profile import SimProfile
from sim._scheduler import SchedSeq, Scheduler, StepPlan

_log = logging.getLogger(__name__)

# How far behind its timeline the loop may be and still make it up (a few steps): beyond
# that, the steps made up at once would come as a burst no engine sends.
CATCH_UP_S = 0.1


@dataclass(eq=False, slots=True, kw_only=True)
class SimSequence(SchedSeq):
    """One request inside the engine: the scheduler's view plus time and delivery."""

    model: str
    finish_reason: str  # reported once max_tokens are out: "length" or "stop"
    metrics: ModelMetrics
    streamed: bool
    arrival_s: float
    admitted_s: float = 0.0  # first admission; a preemption does not reset it
    last_token_s: float = 0.0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)


class Engine:
    """The simulated engine of one app; `run` is its only long-lived task."""

    def __init__(self, profile: SimProfile, metrics: SimMetrics) -> None:
        self._metrics = metrics
        self._scheduler: Scheduler[SimSequence] = Scheduler(profile)
        self._total_blocks = profile.num_kv_blocks
        self._work = asyncio.Event()
        self._accepting = False
        self._timeline: float | None = None  # where the last step's modeled time ended

    @property
    def accepting(self) -> bool:
        """True while the loop runs; requests submitted otherwise would never be served."""
        return self._accepting

    def submit(
        self,
        model: str,
        prompt_tokens: int,
        max_tokens: int,
        finish_reason: str,
        *,
        priority: int = 0,
        streamed: bool = True,
        prefix_blocks: tuple[int, ...] = (),
    ) -> SimSequence:
        if not self._accepting:
            raise EngineStopped("the engine simulator loop is not running")
        seq = SimSequence(
            model=model,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            priority=priority,
            prefix_blocks=prefix_blocks,
            finish_reason=finish_reason,
            metrics=self._metrics.model(model),
            streamed=streamed,
            arrival_s=time.monotonic(),
        )
        self._scheduler.add(seq)
        self._work.set()
        return seq

    def abort(self, seq: SimSequence) -> None:
        """Drop a sequence wherever it is; a no-op once it has ended."""
        if self._scheduler.abort(seq):
            seq.metrics.aborted()
            seq.wakeup.set()

    def abort_all(self) -> None:
        for seq in [*self._scheduler.waiting, *self._scheduler.running]:
            self.abort(seq)

    async def run(self) -> None:
        """Step until cancelled; whatever ends the loop aborts every open request."""
        self._accepting = True
        try:
            while True:
                if not self._scheduler.has_work:
                    self._work.clear()  # sleep, not spin, while there is no work
                    self._timeline = None  # idle: the next step starts when work comes
                    await self._work.wait()
                await self._step()
        except Exception:
            _log.exception("engine simulator loop crashed; aborting every open request")
            raise
        finally:
            self._accepting = False
            self.abort_all()

    async def _step(self) -> None:
        started, lost = self._start()
        plan = self._scheduler.schedule()
        self._note_plan(plan, started)
        # Sleep to a deadline, so the loop's own CPU time is part of the step.
        deadline = started + plan.duration_s
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        self._timeline = deadline
        self._emit(plan, time.monotonic())
        self._metrics.stepped(plan.decode_seqs + plan.prefill_tokens, plan.duration_s, lost)

    def _start(self) -> tuple[float, float]:
        """When the step begins on the timeline, and the time lost before it: none while
        the loop is at most ``CATCH_UP_S`` behind the last step's end (made up), else all
        of it (the timeline starts again from now)."""
        now = time.monotonic()
        if self._timeline is None:
            return now, 0.0
        behind = now - self._timeline
        if behind <= CATCH_UP_S:
            return self._timeline, 0.0
        return now, behind

    @staticmethod
    def _note_plan(plan: StepPlan[SimSequence], now: float) -> None:
        for seq in plan.admitted:
            if not seq.admitted_s:
                seq.admitted_s = now
            # As vLLM V1: every admission from the waiting queue looks the prompt up.
            seq.metrics.prefix_lookup(seq.prompt_tokens + seq.generated, seq.cached)
        for seq in plan.preempted:
            seq.metrics.preempted()

    def _emit(self, plan: StepPlan[SimSequence], now: float) -> None:
        output = self._scheduler.complete(plan)
        for seq in output.emitted:
            if seq.generated == 1:
                seq.metrics.first_token(seq.prompt_tokens, now - seq.arrival_s)
            else:
                seq.metrics.next_token(now - seq.last_token_s)
            seq.last_token_s = now
            if seq.streamed:
                seq.wakeup.set()
        for seq in output.finished:
            seq.metrics.finished(
                seq.finish_reason, now - seq.arrival_s, seq.admitted_s - seq.arrival_s
            )
            seq.wakeup.set()

    # EngineState, read by the /metrics gauges at scrape time.

    def num_waiting(self, model: str) -> int:
        return sum(1 for seq in self._scheduler.waiting if seq.model == model)

    def num_running(self, model: str) -> int:
        return sum(1 for seq in self._scheduler.running if seq.model == model)

    def kv_cache_usage(self, model: str) -> float:
        held = sum(seq.blocks for seq in self._scheduler.running if seq.model == model)
        return held / self._total_blocks


@contextlib.asynccontextmanager
async def engine_running(engine: Engine) -> AsyncIterator[None]:
    """Run the engine loop for the app's lifetime (the app's lifespan enters this)."""
    task = asyncio.create_task(engine.run(), name="sim-engine")
    await asyncio.sleep(0)  # let the loop start accepting before the first request
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
