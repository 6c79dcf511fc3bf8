"""The engine loop: continuous batching over simulated time.

`Engine` owns a FIFO waiting queue and a running set; one asyncio task steps
them. Each step asks the scheduler which waiting requests to admit (their
prompts are prefilled in that step), sleeps for the step's simulated duration,
then lets every running sequence emit one token. So the first token arrives
one step after admission, and `vllm:num_requests_waiting` grows when requests
arrive faster than the batch frees slots.

Who owns a sequence: `submit` puts it in the waiting queue; the loop moves it
to the running set and later to FINISHED; `abort` (a client went away, or the
app shuts down) may take it from either place at any time and frees its slot at
once. A sequence reaches FINISHED or ABORTED exactly once. The HTTP layer
follows a sequence through its `wakeup` event, set after every change.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from workers.sim._errors import EngineStopped
from workers.sim._metrics import ModelMetrics, SimMetrics
from workers.sim._profile import SimProfile
from workers.sim._scheduler import FcfsScheduler

_log = logging.getLogger(__name__)


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False, slots=True)
class SimSequence:
    """One request inside the engine. Identity equality: each is its own entry."""

    model: str
    prompt_tokens: int
    max_tokens: int
    finish_reason: str  # reported once max_tokens are out: "length" or "stop"
    metrics: ModelMetrics
    arrival_s: float
    status: SeqStatus = SeqStatus.WAITING
    generated: int = 0
    admitted_s: float = 0.0
    last_token_s: float = 0.0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self.status in (SeqStatus.FINISHED, SeqStatus.ABORTED)


class Engine:
    """The simulated engine of one app; `run` is its only long-lived task."""

    def __init__(self, profile: SimProfile, metrics: SimMetrics) -> None:
        self._profile = profile
        self._metrics = metrics
        self._scheduler = FcfsScheduler(profile)
        self._waiting: deque[SimSequence] = deque()
        # A dict as an insertion-ordered set: O(1) removal on abort or finish.
        self._running: dict[SimSequence, None] = {}
        self._work = asyncio.Event()
        # A simple KV estimate: room for every slot to hold a full-length sequence.
        self._kv_capacity_tokens = profile.max_num_seqs * profile.max_model_len
        self._accepting = False

    @property
    def accepting(self) -> bool:
        """True while the loop runs; requests submitted otherwise would never be served."""
        return self._accepting

    def submit(
        self, model: str, prompt_tokens: int, max_tokens: int, finish_reason: str
    ) -> SimSequence:
        if not self._accepting:
            raise EngineStopped("the engine simulator loop is not running")
        seq = SimSequence(
            model=model,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            finish_reason=finish_reason,
            metrics=self._metrics.model(model),
            arrival_s=time.monotonic(),
        )
        self._waiting.append(seq)
        self._work.set()
        return seq

    def abort(self, seq: SimSequence) -> None:
        """Drop a sequence wherever it is; a no-op once it has finished."""
        if seq.status is SeqStatus.WAITING:
            self._waiting.remove(seq)
        elif seq.status is SeqStatus.RUNNING:
            del self._running[seq]
        else:
            return
        seq.status = SeqStatus.ABORTED
        seq.metrics.aborted()
        seq.wakeup.set()

    def abort_all(self) -> None:
        for seq in [*self._waiting, *self._running]:
            self.abort(seq)

    async def run(self) -> None:
        """Step until cancelled; whatever ends the loop aborts every open request."""
        self._accepting = True
        try:
            while True:
                if not self._waiting and not self._running:
                    self._work.clear()  # sleep, not spin, while there is no work
                    await self._work.wait()
                await self._step()
        except Exception:
            _log.exception("engine simulator loop crashed; aborting every open request")
            raise
        finally:
            self._accepting = False
            self.abort_all()

    async def _step(self) -> None:
        started = time.monotonic()
        plan = self._scheduler.plan(self._waiting, len(self._running))
        for _ in range(plan.admit):
            self._admit(self._waiting.popleft(), started)
        # Sleep to a deadline, so the loop's own CPU time is part of the step.
        await asyncio.sleep(max(0.0, started + plan.duration_s - time.monotonic()))
        self._emit(time.monotonic())

    def _admit(self, seq: SimSequence, now: float) -> None:
        seq.status = SeqStatus.RUNNING
        seq.admitted_s = now
        self._running[seq] = None
        seq.metrics.prefilled(seq.prompt_tokens)

    def _emit(self, now: float) -> None:
        finished = []
        for seq in self._running:
            if seq.generated == 0:
                seq.metrics.first_token(now - seq.arrival_s)
            else:
                seq.metrics.next_token(now - seq.last_token_s)
            seq.generated += 1
            seq.last_token_s = now
            if seq.generated >= seq.max_tokens:
                finished.append(seq)
            seq.wakeup.set()
        for seq in finished:
            del self._running[seq]
            seq.status = SeqStatus.FINISHED
            seq.metrics.finished(
                seq.finish_reason, now - seq.arrival_s, seq.admitted_s - seq.arrival_s
            )

    # EngineState, read by the /metrics gauges at scrape time.

    def num_waiting(self, model: str) -> int:
        return sum(1 for seq in self._waiting if seq.model == model)

    def num_running(self, model: str) -> int:
        return sum(1 for seq in self._running if seq.model == model)

    def kv_cache_usage(self, model: str) -> float:
        held = sum(s.prompt_tokens + s.generated for s in self._running if s.model == model)
        return held / self._kv_capacity_tokens


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
