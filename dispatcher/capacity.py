"""An engine's capacity, learned from its metrics: how many requests it runs at once (pure).

No deployment writes this number. An engine's running set is bounded by its slots
(vLLM's ``--max-num-seqs``, SGLang's ``--max-running-requests``, llama.cpp's
``--parallel``) or, earlier, by its KV cache (long prompts and answers fill the blocks
before the slots); what bounds it shows in the same two gauges, running and waiting:
requests wait only while the engine cannot take them.

So a scrape that finds requests waiting, after one that found them waiting too at a
running set that did not grow, with at least ``FULL_STEPS`` engine steps in between
(each step admits what a free slot or free blocks can take), shows the engine full at
its running set: ``Capacity.full_at`` -- provided more wait at the second than fairq's
jobs handed over within the last few steps (``start_window_s``), which wait only for
the next step to take them in: a flood refilled as its answers end always has a few.
Waiting through one long prefill step, or between two scrapes less than a step apart,
shows nothing. ``Capacity.slots`` is the largest running set seen full (or seen at
all, once one was seen full): the slot bound, which only a restart lowers. A
``full_at`` below it is the KV-bound regime, and the room it leaves is what the engine
runs now.

Speed: the scrape budget spaces reads of a loaded engine up to a second apart, and the
first sample that shows requests waiting cannot tell a full batch from one prefill
step. ``Capacity.confirm`` asks for a second read a few steps later, outside the
budget, whenever a sample shows requests begin to wait at a running set not yet known
full, and again after a confirming read that found the running set still growing: a
flood's first second is when a newcomer's wait depends on the batch being known. Once a
capacity is known the scraper spaces them (``Scraper._confirm``).

Restarts: an engine restarted (its step or token counters went backwards) may run other
flags: what was learned is forgotten and learned again.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.engine_metrics import EngineSample

FULL_STEPS = 2  # engine steps between two scrapes that show requests waiting
CONFIRM_STEPS = 3  # a confirming read comes this many engine steps after the first
CONFIRM_MIN_S = 0.03  # ... and never sooner (no step time known yet: this)
# A job sent into room has its first token within this many engine steps (the step that
# takes it in, its prefill, the worker's and the dispatcher's round trip), and not
# before ``START_MIN_S``: until then it is starting, not waiting
# (``broker/lua/unseen.lua`` counts them; ``pacing.starting_refills``). Longer, and a
# flood's first requests to wait look starting for as long, which delays learning its
# batch by a scrape.
START_STEPS = 3
START_MIN_S = 0.05
# KV-cache use from which a running set seen full below the slots is the KV cache's bound:
# with most of the cache free, requests waited for something else than room (a step's
# prefill budget), and the slots stand (``AdmissionConfig.room_in``)
KV_BOUND = 0.5


@dataclass(frozen=True)
class Capacity:
    """What one endpoint's scrapes have shown of its capacity."""

    slots: int = 0  # the largest running set seen full, or larger since (0: not yet seen)
    full_at: int | None = None  # the running set at which the last two scrapes saw it full
    confirm: bool = False  # the last sample showed requests waiting at an unknown running set
    most: int = 0  # the largest running set any scrape showed
    kv_at_full: float | None = None  # the KV-cache use when last seen full (None: not said)

    def learn(
        self, previous: EngineSample | None, current: EngineSample, starting: int = 0
    ) -> Capacity:
        """The capacity after a scrape that read ``current`` (``previous``: the scrape before,
        or None). ``starting``: fairq's jobs handed over within the start window without a
        first token at ``current`` (the module docstring)."""
        if previous is not None and _restarted(previous, current):
            return Capacity().learn(None, current, starting)
        running = int(current.running)
        slots = max(self.slots, running) if self.slots else 0
        most = max(self.most, running)
        if current.waiting <= 0 or running <= 0:
            # A running set larger than any before while the capacity is unknown: a flood's
            # ramp, whose next sends may fill the engine; a read a few steps later shows
            # whether they wait, where the budget's next may come a second later. (Each
            # such read needs a new largest running set, so a light load adds few.)
            rising = not slots and running > self.most
            return Capacity(slots, confirm=rising, most=most)
        if current.waiting > starting and _full(previous, current):
            return Capacity(max(slots, running), running, most=most, kv_at_full=current.kv_usage)
        # Requests began to wait at a running set not known full: a second read tells. So
        # does another after a read that found the running set grown since the last (a
        # flood's ramp): the budget's next read may come a second later, when a flood
        # whose answers end together waits for nothing. Not after one that found too few
        # steps: an engine whose counters stand still would be read every few steps.
        # And while the capacity is unknown, so does a read that found no more waiting
        # than fairq's jobs starting: a flood's ramp sends a round's jobs together, and
        # whether they wait for room or only for the next step shows a few steps later,
        # not a budget's second later, while newcomers that came meanwhile wait for it.
        began = previous is None or previous.waiting <= 0
        grew = previous is not None and current.running > previous.running
        unsure = not slots and current.waiting <= starting
        confirm = (began or grew or unsure) and running != slots
        return Capacity(slots, None, confirm=confirm, most=most)

    def disagrees(self, configured: int | None) -> str | None:
        """Why the engine's batch is not ``configured`` (``batch_slots``; None or 0: not
        configured), as far as its scrapes showed; None where they agree or say nothing."""
        if not configured:
            return None
        if self.most > configured:
            return f"the engine ran {self.most} requests at once, more than batch_slots"
        full_below = self.slots and self.slots < configured and self.full_at == self.slots
        if full_below and kv_bounds(self.kv_at_full):
            return f"the engine was full at {self.slots} requests, fewer than batch_slots"
        return None

    @property
    def known(self) -> bool:
        return self.slots > 0


def kv_bounds(kv_usage: float | None) -> bool:
    """Whether a running set seen full below the slots, at this KV-cache use, is the KV
    cache's bound (``KV_BOUND``; None: the engine does not say, so it may be)."""
    return kv_usage is None or kv_usage >= KV_BOUND


def _full(previous: EngineSample | None, current: EngineSample) -> bool:
    """Requests waited at both scrapes, the running set did not grow in between, and the
    engine made at least ``FULL_STEPS`` steps meanwhile: they waited for room."""
    if previous is None or previous.waiting <= 0:
        return False
    if current.running > previous.running:
        return False
    return steps_between(previous, current) >= FULL_STEPS


def steps_between(previous: EngineSample, current: EngineSample) -> float:
    """Engine steps from one sample to the next: its step counter where it has one, else
    its output tokens (every running request emits one per decode step)."""
    if previous.steps is not None and current.steps is not None:
        return current.steps - previous.steps
    if previous.generated is not None and current.generated is not None:
        return (current.generated - previous.generated) / max(current.running, 1.0)
    return 0.0


def _restarted(previous: EngineSample, current: EngineSample) -> bool:
    """A counter went backwards: the engine behind the endpoint started afresh."""
    pairs = (
        (previous.steps, current.steps),
        (previous.generated, current.generated),
        (previous.e2e_count, current.e2e_count),
    )
    return any(a is not None and b is not None and b < a for a, b in pairs)


def confirm_delay_s(step_s: float | None) -> float:
    """How long after a sample that asks to ``confirm`` the confirming read goes."""
    return max(CONFIRM_MIN_S, CONFIRM_STEPS * (step_s or 0.0))


def start_window_s(step_s: float | None) -> float:
    """How long a job handed over into room may take to show its first token."""
    return max(START_MIN_S, START_STEPS * (step_s or 0.0))
