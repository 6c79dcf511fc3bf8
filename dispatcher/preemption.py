"""Preemption: take jobs back out of an engine so that a newcomer is next in it.

While a newcomer (a user with nothing in the engine) was sent beyond an endpoint's batch,
or is still queued, the jobs beyond the batch are taken back (``DispatchStore.park``: the
heaviest user's newest without output, else their oldest that can be resumed mid-answer;
a user's only job never), so the newcomer is first in the engine's queue and, when one of
those was running, gets its slot at the next step. While the batch is still learned,
a newcomer sent in this round has the jobs beyond a fresh scrape's running set taken back
once (``room_for_take_back``). Where a newcomer's prefill step is
kept clear (``dispatcher.newcomer_step``), the streamed jobs handed over within the last
step without output are taken back too: they may still wait for that step, and would
share it. On an engine shared by several models a job is taken from the model with the
most jobs there that has one to give, so a newcomer of one model is not held back by
another's flood. At most ``MAX_PARKS`` jobs per endpoint and kind per round.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from broker import DispatchStore, ModelConfig, ModelSnapshot, Parked, telemetry
from dispatcher.admission import AdmissionConfig, EndpointState
from dispatcher.newcomer_step import YOUNG_STEPS

log = logging.getLogger(__name__)

MAX_PARKS = 4  # jobs taken back out of one endpoint per round, of each kind


@dataclass(frozen=True)
class RoundEnd:
    """What a round of ``model`` left: its state, its endpoints' states, and the newcomers
    it (or enqueue.lua, express) sent to each endpoint since the last round; of those,
    ``carried`` were sent in an earlier round and carried on (``Round._add_unplaced``)."""

    model: ModelConfig
    snap: ModelSnapshot
    states: Sequence[EndpointState]
    config: AdmissionConfig
    newcomers_sent: Mapping[str, int]
    carried: Mapping[str, int] = field(default_factory=dict)


class TakeBack(Protocol):
    """The round's last stage: what to take back out of the engines."""

    async def make_room(self, end: RoundEnd) -> set[str]:
        """Returns the models whose jobs were taken back: their views are stale now."""
        ...


class Preemption:
    """Takes jobs back out of engines for newcomers. ``views``: each model's latest
    snapshot (the dispatcher's own dict, read for the loads of models sharing an engine)."""

    def __init__(
        self,
        store: DispatchStore,
        engine_of: Mapping[str, Sequence[ModelConfig]],
        views: Mapping[str, ModelSnapshot],
    ) -> None:
        self._store = store
        self._engine_of = engine_of
        self._views = views

    async def make_room(self, end: RoundEnd) -> set[str]:
        model, snap, config = end.model, end.snap, end.config
        top = snap.backlogs[0] if snap.backlogs else None
        queued = [u for u, _ in top.users if not snap.in_engine.get(u)] if top else []
        parked: set[str] = set()
        for state in end.states:
            sent = end.newcomers_sent.get(state.endpoint, 0)
            fresh = sent - end.carried.get(state.endpoint, 0)
            batch = room_for_take_back(config, state, fresh)
            if batch is None or not (sent or queued):
                continue
            # Every job beyond the batch waits in the engine's queue, ahead of a newcomer
            # queued now; a newcomer sent beyond it needs one running job out of its way.
            parked |= await self._park(model, snap, state.endpoint, state.inflight - batch)
            if sent and state.newcomer_step and state.tpot_s:
                # Refills handed over within the last step may share the newcomer's.
                young_ms = max(1, round(state.tpot_s * YOUNG_STEPS * 1000))
                parked |= await self._park(model, snap, state.endpoint, MAX_PARKS, young_ms)
        return parked

    async def _park(
        self, model: ModelConfig, snap: ModelSnapshot, endpoint: str, most: int, young_ms: int = 0
    ) -> set[str]:
        """Take up to ``most`` (at most ``MAX_PARKS``) jobs back out of ``endpoint``
        (``_park_one``); the models whose jobs were taken."""
        parked: set[str] = set()
        for _ in range(min(most, MAX_PARKS)):
            taken = await self._park_one(model, snap, endpoint, young_ms=young_ms)
            if taken is None:
                break
            parked.add(taken[0])
        return parked

    async def _park_one(
        self, model: ModelConfig, snap: ModelSnapshot, endpoint: str, *, young_ms: int = 0
    ) -> tuple[str, Parked] | None:
        """Take one job back out of ``endpoint`` (``DispatchStore.park``, ``young_ms`` as
        there), of the model of its engine with the most jobs there that has one to give;
        (that model, the job)."""
        loads = {model.name: snap.inflight.get(endpoint, 0)}
        for other in self._engine_of[model.name]:
            if other.name != model.name and (view := self._views.get(other.name)) is not None:
                loads[other.name] = view.inflight.get(endpoint, 0)
        for name in sorted(loads, key=lambda n: -loads[n]):
            taken = await self._store.park(name, endpoint, young_ms=young_ms)
            if taken is not None:
                telemetry.PREEMPTIONS.labels(name).inc()
                log.debug("took job %s of %s back out of %s", taken.job_id, taken.user, endpoint)
                return name, taken
        return None


def room_for_take_back(config: AdmissionConfig, state: EndpointState, fresh: int) -> int | None:
    """The requests the engine takes now, as the take-back stage counts them: the batch
    admission knows (``AdmissionConfig.room_in``); while it is unknown, for newcomers sent
    in this round (``fresh``; not those carried on), the running set of a fresh scrape
    that found requests waiting: the jobs beyond it may wait ahead of the newcomer, for
    room or for a prefill budget. Taken back once per newcomer, they go again behind it
    (the engine's queue is first come, first served); a newcomer that lands while a
    flood's ramp fills the batch waited out the learning before (16 slots: 300 ms,
    against 40 ms). None: nothing to make room under."""
    batch = config.room_in(state)
    if batch is not None or fresh <= 0 or not state.fresh:
        return batch
    if state.waiting <= 0 or state.running <= 0:
        return None
    return int(state.running)


def may_wait_behind(state: EndpointState, batch: int | None) -> bool:
    """Whether a newcomer sent to ``state``'s endpoint may still wait there behind fairq's
    jobs, so that the take-back stage goes on making room for it in later rounds (a few
    jobs a round): while the capacity (``batch``) is unknown; once it is, while jobs beyond
    the batch remain (16 slots: a newcomer waited a second behind the 12 one round left);
    or while the engine holds started ones back in its queue, where it put them ahead of
    the newcomer (KV-bound long answers: a newcomer waited a second behind one the engine
    preempted after the round had made room)."""
    return batch is None or state.inflight > batch or state.put_back > 0


class NoTakeBack:
    """The stage off: a newcomer waits for a slot to free; nothing is taken back."""

    async def make_room(self, end: RoundEnd) -> set[str]:
        return set()
