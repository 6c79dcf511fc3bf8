"""Which waiting requests join the batch in the next engine step, and how long it lasts.

Pure: plain values in, plain values out, no asyncio and no clock, so the policy
is testable on hand-made queues. The engine loop (`_engine.py`) feeds it and
applies the plan. Later policies (a chunked-prefill token budget, KV-cache
capacity with preemption, priority order) extend `plan` or sit beside
`FcfsScheduler` without touching the loop or the HTTP layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Protocol

from workers.sim._profile import SimProfile


class Schedulable(Protocol):
    """What the scheduler needs to know about a waiting request."""

    @property
    def prompt_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One engine step: admit the first `admit` waiting requests, then compute."""

    admit: int
    prefill_tokens: int
    batch_size: int
    duration_s: float


class FcfsScheduler:
    """First come, first served into at most `max_num_seqs` running slots.

    Every admitted prompt is prefilled whole in the step that admits it (no
    token budget yet), so a long prompt lengthens that step for everyone in
    the batch, as it does in a real engine.
    """

    def __init__(self, profile: SimProfile) -> None:
        self._profile = profile

    def plan(self, waiting: Sequence[Schedulable], num_running: int) -> StepPlan:
        free = max(0, self._profile.max_num_seqs - num_running)
        admitted = list(islice(waiting, free))
        prefill = sum(seq.prompt_tokens for seq in admitted)
        batch = num_running + len(admitted)
        return StepPlan(
            admit=len(admitted),
            prefill_tokens=prefill,
            batch_size=batch,
            duration_s=step_duration_s(self._profile, batch, prefill),
        )


def step_duration_s(profile: SimProfile, batch_size: int, prefill_tokens: int) -> float:
    """Wall time of one step: a fixed cost, a cost per running sequence, and prefill."""
    ms = (
        profile.step_base_ms
        + profile.step_per_seq_ms * batch_size
        + profile.prefill_ms_per_token * prefill_tokens
    )
    return ms / 1000.0
