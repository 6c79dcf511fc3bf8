"""The stages of a model's dispatch round, chosen once from its settings (no I/O).

Every model's round (``dispatcher.round``) runs the same stages in the same order; what
differs is the form each takes, chosen here when the dispatcher starts. A mechanism is
a stage with an "off" form, so the round itself reads no setting:

1. band: the most urgent backlogged band (strict priority between bands; always on).
2. endpoints: what is known of each endpoint now (``dispatcher.endpoints``), marked by
   the newcomer's step (``step``: ``KeepStepClear`` or ``NoStepHold``) and the refill
   pace (``pace``: ``PacedRefills`` or ``UnpacedRefills``).
3. room: how many jobs each endpoint may take, and how many of them users already in
   the engine (``admission``: ``metrics`` or ``static``, with its ``config``: queue
   targets, the engine's capacity, kept slots).
4. who is next: the fairness policy inside the band (``fair``: ``round_robin`` or
   ``token_fair``), users already in the engine only within their part of the room
   (none while ``step`` holds refills for a newcomer).
5. where: routing (``route``: ``least_loaded`` or ``prefix``).
6. send: the dispatch script applies the plan, each job with a priority for the
   engine's own scheduler where it runs one (``engine_priority``).
7. take back: preemption for newcomers (``take_back``: ``Preemption`` or
   ``NoTakeBack``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker import ModelConfig
from dispatcher.admission import ADMISSION, AdmissionConfig, AdmissionPolicy
from dispatcher.affinity import Router
from dispatcher.fairness import FairPolicy, policy
from dispatcher.newcomer_step import KeepStepClear, NewcomerSteps, NoStepHold, StepHold
from dispatcher.pacing import PacedRefills, Pacer, RefillPace, UnpacedRefills
from dispatcher.preemption import NoTakeBack, Preemption, TakeBack

# The stages in the order a round runs them (docs/architecture.md, "A dispatch round").
ORDER = ("band", "endpoints", "room", "who is next", "where", "send", "take back")
MAX_PICKS = 64  # per script call: a huge room (a static cap of 100,000) is served in rounds


@dataclass(frozen=True)
class Stages:
    """One model's stages (the module docstring)."""

    admission: AdmissionPolicy
    config: AdmissionConfig
    fair: FairPolicy
    route: Router
    step: StepHold
    pace: RefillPace
    take_back: TakeBack
    scraped: bool  # admission reads the engine's metrics
    # Admission bounds users already in the engine by its batch: a round reads which of the
    # backlogged users have jobs in it
    users_in_engine: bool
    engine_priority: bool  # each job carries a priority for the engine's scheduler
    depth: int  # backlogged users a round reads per band (``depth``)


@dataclass(frozen=True)
class Shared:
    """What the stages of all models keep per endpoint, one of each per dispatcher (the
    models of one engine share its endpoints, and they agree on these settings:
    ``broker.engines``)."""

    holds: NewcomerSteps
    pacer: Pacer
    preemption: Preemption


def build(model: ModelConfig, bands: Sequence[str], shared: Shared) -> Stages:
    """``model``'s stages, each in the form its settings choose."""
    scraped = model.admission_policy == "metrics"
    users_in_engine = scraped and model.batch_slots != 0
    config = AdmissionConfig.of(model, bands)
    # The newcomer's step and the pace need the batch rule, which tells newcomers from
    # users already in the engine.
    step: StepHold = NoStepHold()
    if model.clear_newcomer_step and users_in_engine:
        step = KeepStepClear(shared.holds)
    pace: RefillPace = UnpacedRefills()
    if model.pace_refills and users_in_engine:
        pace = PacedRefills(shared.pacer)
    take_back: TakeBack = shared.preemption if model.preemption else NoTakeBack()
    return Stages(
        admission=ADMISSION[model.admission_policy],
        config=config,
        fair=policy(model.policy),
        route=Router(model.routing, model.routing_load_bound),
        step=step,
        pace=pace,
        take_back=take_back,
        scraped=scraped,
        users_in_engine=users_in_engine,
        engine_priority=model.engine_priority,
        depth=depth(model, config),
    )


def depth(model: ModelConfig, config: AdmissionConfig) -> int:
    """Backlogged users a round reads per band. A plan never has more picks than this, so
    the lowest ``depth`` users are enough: reading more would make a round cost
    O(backlogged users)."""
    return min(max(model.inflight_cap, *config.targets.values()), MAX_PICKS)
