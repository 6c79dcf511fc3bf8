"""Which endpoints keep their next engine step clear for a newcomer's prefill (pure, no I/O).

A newcomer (a user with nothing in the engine) sent to an endpoint is prefilled in the
engine's next step, together with every other request waiting there then. Under a flood
those are the heavy users' refills, sent as slots free; their prompts are long, and their
prefill lengthens the newcomer's step several times over (on the simulator's H100 profile
three 1,000-token prompts add ~150 ms to a ~60 ms step). So for ``HOLD_STEPS`` engine
steps after a newcomer is sent (the step in progress, which may be a long one, and the
newcomer's), the endpoint takes nothing more of users already in it
(``EndpointState.newcomer_step``), and the dispatcher takes back their streamed jobs
handed over within ``YOUNG_STEPS`` steps that have no output yet (``DispatchStore.park``
with ``young_ms``): they go back to the head of their users' queues and are sent again
once the step is clear. (A job streamed from the engine for a whole answer counts until
its first token. Not jobs the engine does not stream: they show no output until their
end, so nothing tells whether their prefill is done, and taking one back wastes it.)

Costs: a freed slot stays empty for up to ``HOLD_STEPS`` steps per newcomer, and a refill
taken back that had already started its prefill does it again. That is why only refills
handed over within the last step are taken back: one handed over earlier has most likely
begun its prefill in the step in progress, which the newcomer waits out anyway, so taking
it back would clear nothing and waste the prefill (with a newcomer a second in the
simulator's seed flood, two steps took back twice as many refills and cost 3 points of
the flood's tokens/s for the same newcomer p95; docs/performance.md). So that newcomers
coming one after another never hold the users in the engine back for good, an endpoint
is held at most half the time: after a hold ends, the next starts only once as long has
passed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

# An engine step is the engine's recent mean time per output token. A step with prefill in
# it is longer than the mean, so the hold lasts two of them; a refill is young (may still
# wait for the newcomer's step) for one.
HOLD_STEPS = 2.0
YOUNG_STEPS = 1.0


@dataclass
class _Hold:
    start: float
    end: float


class NewcomerSteps:
    """Endpoint -> its current or last hold for a newcomer's step."""

    def __init__(self) -> None:
        self._holds: dict[str, _Hold] = {}

    def hold(self, endpoint: str, step_s: float, now: float) -> bool:
        """A newcomer was sent to ``endpoint`` at ``now``; its engine steps ``step_s``. Starts
        or extends the endpoint's hold; False when it is in the rest after one (nothing held)."""
        last = self._holds.get(endpoint)
        end = now + step_s * HOLD_STEPS
        if last is not None and now < last.end:  # another newcomer: its step too, within
            last.end = min(max(last.end, end), last.start + 2 * step_s * HOLD_STEPS)  # a bound
            return True
        if last is not None and now < last.end + (last.end - last.start):
            return False
        self._holds[endpoint] = _Hold(now, end)
        return True

    def clearing(self, now: float) -> frozenset[str]:
        """The endpoints held at ``now``."""
        return frozenset(e for e, hold in self._holds.items() if now < hold.end)


class StepHold(Protocol):
    """The round's stage for a newcomer's prefill step (this module's docstring)."""

    def clearing(self, now: float) -> Collection[str]:
        """The endpoints whose next step is kept clear of refills now."""
        ...

    def holds_refills(self, backlog: Sequence[tuple[str, float]], busy: Collection[str]) -> bool:
        """Whether users already in the engine get no room this round: a newcomer is
        backlogged, and is sent alone so that the step it is prefilled in is its own."""
        ...

    def newcomer_sent(self, endpoint: str, step_s: float | None, now: float) -> None:
        """A newcomer went to ``endpoint``, whose engine steps ``step_s`` (None: unknown)."""
        ...


class KeepStepClear:
    """Holds refills back for ``HOLD_STEPS`` after a newcomer is sent (``NewcomerSteps``;
    one per dispatcher, shared by the models of one engine)."""

    def __init__(self, holds: NewcomerSteps) -> None:
        self._holds = holds

    def clearing(self, now: float) -> Collection[str]:
        return self._holds.clearing(now)

    def holds_refills(self, backlog: Sequence[tuple[str, float]], busy: Collection[str]) -> bool:
        return any(user not in busy for user, _ in backlog)

    def newcomer_sent(self, endpoint: str, step_s: float | None, now: float) -> None:
        # Timed by the engine's recent step: unknown before a scrape shows one, nothing kept.
        if step_s:
            self._holds.hold(endpoint, step_s, now)


class NoStepHold:
    """The stage off: a newcomer's step is shared with whatever refills come."""

    def clearing(self, now: float) -> Collection[str]:
        return ()

    def holds_refills(self, backlog: Sequence[tuple[str, float]], busy: Collection[str]) -> bool:
        return False

    def newcomer_sent(self, endpoint: str, step_s: float | None, now: float) -> None:
        return None
