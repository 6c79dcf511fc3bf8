"""Refills paced by the engine's step (pure, no I/O).

The engine prefills whatever it was sent since its last step in its next one. Refills of
users already in the engine sent in a burst (several slots freed at once, or a scrape
showing that a burst of jobs that are not streamed has started) make one long step, and
a newcomer arriving during it waits it out before its own step begins. So refills go at
about the rate requests end: one more per engine step than the engine ends, one every
``step / (ends + 1)`` -- the same prefill work, spread evenly over the steps. At the rate
itself, not a whole number of refills per step below it: 1.3 ends a step refilled once a
step would shrink the batch until only one ended a step (a 256-slot batch of 200-token
answers to about 200). And one more than it, so that a batch with free slots grows: at
the end rate alone (at least one a step) it stopped growing where one request ended a
step, the same 200 of 256 slots, whatever was waiting. A full batch takes no more than
its free slots (``dispatcher.admission``), so the extra one a step only paces its growth.

The engine's step and its ended requests per second come from its metrics over windows
of a second or more (``engine_metrics.PaceWindow``), not between two scrapes, where a step
without a prefill in it reads as a fraction of one with, and a pace from it would pile
refills up in the engine. No pace is known before the engine has ended a request (the
simulator, for one, shows its end-to-end histogram only then) and a window has closed;
refills keep the scrape's caution alone until then. The pace only ever lowers what
admission allows: the scrape's caution on jobs that are not streamed still holds
(``dispatcher.admission``).

The schedule is kept in time, not counted from the last send: a send that comes late (the
dispatcher's wake-up and round take a few milliseconds) does not push every later one
back, or the pace would drift below the engine's and its batch would shrink. Lateness of
up to one engine step is made up, never more than ``per_step`` refills at once; a schedule
a step or more behind (nothing was sent for that long) starts afresh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from dispatcher.capacity import start_window_s
from dispatcher.engine_metrics import PaceWindow


@dataclass(frozen=True)
class Pace:
    """The rate refills may go at: ``rate`` per engine step of ``step_s`` (the engine's end
    rate and one more), never more than ``per_step`` at once."""

    rate: float
    step_s: float

    @property
    def per_step(self) -> int:
        return math.ceil(self.rate)

    @property
    def interval_s(self) -> float:
        return self.step_s / self.rate


def pace_of(window: PaceWindow | None) -> Pace | None:
    """The pace for an engine whose last whole window says how fast it ends requests and
    how long its steps are; None while either is unknown (before a window has closed), or
    where the engine does not count its ended requests (no window)."""
    if window is None or window.ends_per_s is None or not window.step_s:
        return None
    return Pace(window.ends_per_s * window.step_s + _GROWTH_PER_STEP, window.step_s)


# Refills a step beyond the engine's end rate: a batch with free slots grows by this many a
# step (the module docstring)
_GROWTH_PER_STEP = 1.0


def starting_refills(window: PaceWindow | None) -> float:
    """How many refills the engine's end rate keeps starting at any moment: each freed
    slot's refill is on its way, or in the step that takes it in, or in its prefill, for
    about a start window (``capacity.start_window_s``), so at ``ends`` a second about
    ``ends x window`` of them are. Admission does not count them as a queue ahead of a
    newcomer, who joins the same step: counted as waiting, a 256-slot batch of 200-token
    answers, which ends 1.3 a step, had its refills' starts fill the whole queue target,
    and its batch stopped at 200. 0 while the end rate is unknown."""
    if window is None or window.ends_per_s is None or not window.step_s:
        return 0.0
    return window.ends_per_s * start_window_s(window.step_s)


class Pacer:
    """Endpoint -> when its next refill is due (monotonic seconds)."""

    def __init__(self) -> None:
        self._due: dict[str, float] = {}

    def allowed(self, endpoint: str, pace: Pace, now: float) -> int:
        """How many refills may go to ``endpoint`` at ``now``."""
        due = self._due.get(endpoint)
        if due is None or now - due > pace.step_s:
            return pace.per_step  # none sent for a step or more: a step's worth
        if now < due:
            return 0
        return min(pace.per_step, 1 + math.floor((now - due) / pace.interval_s))

    def due_in(self, endpoint: str, now: float) -> float | None:
        """Seconds until the next refill is due (None: none sent yet)."""
        due = self._due.get(endpoint)
        return None if due is None else due - now

    def sent(self, endpoint: str, count: int, pace: Pace, now: float) -> None:
        """``count`` refills went to ``endpoint`` at ``now``: the schedule moves on by
        theirs from where it was, or from now if it is a step or more behind (nothing was
        sent for that long), and never beyond a step from now."""
        if count <= 0:
            return
        due = self._due.get(endpoint)
        start = now if due is None or now - due > pace.step_s else due
        # At most a step ahead: a burst sent unpaced (while the batch grew to a capacity not
        # learned yet) holds later refills back for its one long prefill step, not for the
        # hundreds of steps its count at the pace would take.
        self._due[endpoint] = min(start + count * pace.interval_s, now + pace.step_s)

    def forget(self, endpoint: str) -> None:
        self._due.pop(endpoint, None)


class RefillPace(Protocol):
    """The round's stage for the pace of refills (this module's docstring)."""

    def allowed(
        self, endpoint: str, window: PaceWindow | None, now: float
    ) -> tuple[int | None, float | None]:
        """The refills ``endpoint`` may take now, and in how long the next is due (None,
        None: not paced, or no pace known yet). ``window``: its engine's pace window."""
        ...

    def sent(self, endpoint: str, refills: int, window: PaceWindow | None, now: float) -> None:
        """``refills`` jobs of users already in the engine went to ``endpoint`` at ``now``."""
        ...

    def forget(self, endpoint: str) -> None: ...


class PacedRefills:
    """Refills at the engine's pace (``Pacer``; one per dispatcher, per endpoint)."""

    def __init__(self, pacer: Pacer) -> None:
        self._pacer = pacer

    def allowed(
        self, endpoint: str, window: PaceWindow | None, now: float
    ) -> tuple[int | None, float | None]:
        pace = pace_of(window)
        if pace is None:
            return None, None
        return self._pacer.allowed(endpoint, pace, now), self._pacer.due_in(endpoint, now)

    def sent(self, endpoint: str, refills: int, window: PaceWindow | None, now: float) -> None:
        pace = pace_of(window)
        if pace is not None:
            self._pacer.sent(endpoint, refills, pace, now)

    def forget(self, endpoint: str) -> None:
        self._pacer.forget(endpoint)


class UnpacedRefills:
    """The stage off: refills go as soon as admission has room for them."""

    def allowed(
        self, endpoint: str, window: PaceWindow | None, now: float
    ) -> tuple[int | None, float | None]:
        return None, None

    def sent(self, endpoint: str, refills: int, window: PaceWindow | None, now: float) -> None:
        return None

    def forget(self, endpoint: str) -> None:
        return None
