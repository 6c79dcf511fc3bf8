"""One model's dispatch round: the stages of ``dispatcher.stages``, in their order.

A round sends from the model's snapshot until the backlog is empty or no endpoint has
room (or one pass, on a shared engine's turn): band -> endpoints -> room -> who is next
-> where -> send, again while it sends, then take back. It knows no mechanism by name:
each is a stage chosen at start, in its "on" or "off" form. After the round it keeps the
state the last dispatch returned (the next round may plan from it), asks for a scrape
where only jobs the last scrape could not show hold the band back, and refreshes the
model's express grant (``dispatcher.express``).

The dispatch script re-checks every bound against Redis's own counts, so a plan from a
stale view can cost fairness for one round at most, never an over-admission.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from broker import (
    DispatchStore,
    ExpressSend,
    ModelConfig,
    ModelSnapshot,
    Pick,
    telemetry,
)
from dispatcher.admission import Decision, EndpointState, Limit, held_by_unseen, refusals
from dispatcher.discovery import LiveEndpoints
from dispatcher.endpoints import METRICS_LAG_S, RateMeter, SentLog, endpoint_states
from dispatcher.express import GrantWriter
from dispatcher.fairness import plan_with_slots
from dispatcher.preemption import RoundEnd, may_wait_behind
from dispatcher.scraper import EndpointView, Scraper
from dispatcher.stages import MAX_PICKS, Stages

log = logging.getLogger(__name__)

_MAX_EMPTY_ROUNDS = 3  # picks that found only emptied queues; each one cleans the backlog
_PACE_SLACK_S = 0.001  # a paced refill's wake-up comes this late, so the step has passed
# Engine steps after a newcomer went to a KV-full engine when a read shows whether the
# engine put a started request back ahead of it: one to take the newcomer in, one to
# preempt, one for the metrics
_PUT_BACK_STEPS = 3


@dataclass(frozen=True)
class Turn:
    """One model's turn on a shared engine: one pass of at most 1/``share`` of the room
    open (at least one job), and at most ``limit`` jobs (0: no bound)."""

    share: int
    limit: int = 0


@dataclass
class RoundEnv:
    """What the rounds of one dispatcher share: Redis, the scraper, the live endpoints,
    the log of sends, and each model's last state (``views``, read for the models that
    share an engine)."""

    store: DispatchStore
    live: LiveEndpoints
    sent: SentLog
    stale_s: float  # metrics older than this are stale
    engine_of: Mapping[str, Sequence[ModelConfig]]
    views: dict[str, ModelSnapshot] = field(default_factory=dict)
    scraper: Scraper | None = None  # while the dispatcher runs, if any model is scraped
    # The model's wake-up event, while the dispatcher runs (a paced refill's timer sets it)
    event: Callable[[str], asyncio.Event] | None = None


class Round:
    """The rounds of one model (``run``), over its ``stages``."""

    def __init__(
        self, model: ModelConfig, stages: Stages, env: RoundEnv, grants: GrantWriter
    ) -> None:
        self.model = model
        self.stages = stages
        self._env = env
        self._grants = grants
        self._rates = RateMeter()
        # endpoint -> jobs of users with none in the engine sent express since the last round
        self._express_newcomers: dict[str, int] = {}
        # endpoint -> (newcomers sent there while its capacity was unknown or jobs beyond
        # its batch waited, when): the take-back stage could not make room for them (all)
        # then; it goes on once the capacity is learned
        self._unplaced: dict[str, tuple[int, float]] = {}
        self._carried: dict[str, float] = {}  # of those, carried into this round: since when
        self._carried_counts: dict[str, int] = {}  # ... and how many
        self._pace_timer = False  # a wake-up is due when the pace lets refills go
        self._noted: set[str] = set()  # endpoints whose engine disagrees with batch_slots

    async def run(self, snap: ModelSnapshot, turn: Turn | None = None) -> int:
        """Send from ``snap`` until the backlog is empty or no endpoint has room, or one
        pass of a ``turn`` of a shared engine; keeps the state after as the model's view.
        Returns the count sent."""
        s, name = self.stages, self.model.name
        total, empty_rounds = 0, 0
        # endpoint -> jobs of users with none in the engine, sent express since the last
        # round or dispatched in this one
        newcomers_sent, self._express_newcomers = self._express_newcomers, {}
        self._add_unplaced(newcomers_sent, time.monotonic())
        while not snap.empty and empty_rounds < _MAX_EMPTY_ROUNDS:
            top = snap.backlogs[0]  # band: strict priority, the most urgent backlogged
            states = self.states(snap)  # endpoints
            decisions = s.route.open(s.admission, states, top.band, s.config)  # room
            if not decisions:
                telemetry.refused(name, top.band, refusals(s.admission, states, top.band, s.config))
                break
            room = min(s.route.room(decisions, len(top.users)), MAX_PICKS)
            if turn is not None:
                room = min(max(1, room // turn.share), turn.limit or room)
            busy = [user for user, jobs in snap.in_engine.items() if jobs > 0]
            served = 0 if s.step.holds_refills(top.users, busy) else _served(decisions)
            picks = plan_with_slots(  # who is next
                s.fair, top.band, top.users, top.join,
                room=room, served_room=served, in_engine=busy,
            )  # fmt: skip
            if not picks:  # no room for users in the engine, and every backlogged one is
                telemetry.refused(name, top.band, {d.endpoint: _held(d) for d in decisions})
                self._wake_when_paced(decisions, states)
                break
            loads = {st.endpoint: st.inflight for st in states if st.healthy}
            routes = s.route.assign(picks, decisions, loads, busy)  # where
            steps = {st.endpoint: st.tpot_s for st in states}
            sent = 0
            for decision, group in routes:  # send
                dispatched, snap = await self._send(decision, group, snap, busy, newcomers_sent)
                if dispatched and any(p.user not in busy for p in group):
                    step_s = steps.get(decision.endpoint)
                    s.step.newcomer_sent(decision.endpoint, step_s, time.monotonic())
                telemetry.DISPATCHED.labels(name, top.band).inc(dispatched)
                sent += dispatched
            total += sent
            empty_rounds = 0 if sent else empty_rounds + 1
            if turn is not None:
                break  # the next model's turn
        snap = await self._take_back(snap, newcomers_sent)
        self._env.views[name] = snap
        if not snap.empty:
            self._scrape_if_held(snap)
        await self.refresh_grant(snap)
        return total

    def states(self, snap: ModelSnapshot) -> list[EndpointState]:
        """What admission knows about each endpoint of the model now."""
        env, name = self._env, self.model.name
        views = None
        if self.stages.scraped and env.scraper is not None:
            views = {ep: env.scraper.view(ep) for ep in env.live.of(name)}
            self._note_override(views)
        others = [
            view
            for m in env.engine_of[name]
            if m.name != name and (view := env.views.get(m.name)) is not None
        ]
        now = time.monotonic()
        return endpoint_states(
            env.live.of(name),
            snap,
            views,
            env.sent,
            now=now,
            stale_s=env.stale_s,
            others=others,
            clearing=self.stages.step.clearing(now),
            pace=self.stages.pace,
        )

    def _note_override(self, views: Mapping[str, EndpointView]) -> None:
        """Say once per endpoint, in the log, where the engine disagrees with the model's
        ``batch_slots`` (status says it too: ``dispatcher.publisher``)."""
        configured = self.stages.config.batch_slots
        if not configured:
            return
        for endpoint, view in views.items():
            if endpoint in self._noted or (why := view.capacity.disagrees(configured)) is None:
                continue
            self._noted.add(endpoint)
            log.warning(
                "model %s: batch_slots is %d for %s, but %s: fairq bounds the batch by "
                "batch_slots (leave it out to learn the engine's own)",
                self.model.name,
                configured,
                endpoint,
                why,
            )

    def view(self, endpoint: str) -> EndpointView | None:
        """The scraper's latest view of an endpoint; None where the model is not scraped."""
        scraper = self._env.scraper
        return scraper.view(endpoint) if self.stages.scraped and scraper is not None else None

    def express_sent(self, sent: ExpressSend) -> None:
        """enqueue.lua sent one of the model's jobs straight to an endpoint (express)."""
        now = time.monotonic()
        self._env.sent.record(sent.endpoint, 1, now, int(sent.plain))
        self._rates.record(1, now)
        self._wake_scraper(sent.endpoint)
        if sent.newcomer:  # it may wait beyond a full batch: the next round makes room
            pending = self._express_newcomers
            pending[sent.endpoint] = pending.get(sent.endpoint, 0) + 1
            view = self.view(sent.endpoint)
            step_s = view.tpot_s if view is not None else None
            self.stages.step.newcomer_sent(sent.endpoint, step_s, now)

    async def refresh_grant(self, snap: ModelSnapshot) -> None:
        """The model's express grant, from the admission decision on ``snap``."""
        endpoints = len(self._env.live.of(self.model.name))
        shared = len(self._env.engine_of[self.model.name]) > 1
        # The engine's room is shared: only the engine's loop may use it.
        allowed = self.stages.route.express(endpoints) and not shared
        await self._grants.refresh(self.model.name, snap, self.states(snap), self.stages, allowed)

    async def _send(
        self,
        decision: Decision,
        picks: Sequence[Pick],
        snap: ModelSnapshot,
        busy: Sequence[str],
        newcomers_sent: dict[str, int],
    ) -> tuple[int, ModelSnapshot]:
        """Dispatch ``picks`` to the decision's endpoint; the count sent and the state after.
        ``newcomers_sent`` counts the jobs of users with none in the engine sent to each
        endpoint."""
        # The script re-checks these bounds against Redis's own counts: a plan from a
        # stale view can never send more than the decision allowed.
        endpoint = decision.endpoint
        inflight = snap.inflight.get(endpoint, 0)
        served_cap = None
        if decision.served_room is not None:
            served_cap = inflight + decision.room_for_served
        fresh = sum(1 for p in picks if p.user not in busy)
        newcomers_sent[endpoint] = newcomers_sent.get(endpoint, 0) + fresh
        dispatched, snap, plain = await self._env.store.dispatch(
            self.model.name,
            endpoint,
            inflight + decision.room,
            picks,
            self.stages.depth,
            engine_priority=self.stages.engine_priority,
            rate=self._rates.rate(time.monotonic()),
            served_cap=served_cap,
        )
        # Sent when the script has run (after its reply), so that a scrape whose
        # in-transit count was read before the script always counts these as sent since.
        now = time.monotonic()
        self._env.sent.record(endpoint, len(dispatched), now, plain)
        self._rates.record(len(dispatched), now)
        view = self.view(endpoint)
        refills = min(len(dispatched), len(picks) - fresh)
        self.stages.pace.sent(endpoint, refills, view.pace if view else None, now)
        if dispatched:
            self._wake_scraper(endpoint)
        return len(dispatched), snap

    async def _take_back(
        self, snap: ModelSnapshot, newcomers_sent: dict[str, int]
    ) -> ModelSnapshot:
        """The take-back stage after a round (``dispatcher.preemption``). Returns the
        snapshot to plan from next (read again if anything was taken back; so are the
        views of the other models of the engine)."""
        env, s = self._env, self.stages
        states = self.states(snap)
        end = RoundEnd(self.model, snap, states, s.config, newcomers_sent, self._carried_counts)
        parked = await s.take_back.make_room(end)
        self._scrape_after_newcomers(states, newcomers_sent)
        now = time.monotonic()
        for state in states:
            sent = newcomers_sent.get(state.endpoint, 0)
            batch = s.config.room_in(state)
            if sent and may_wait_behind(state, batch):
                since = self._carried.get(state.endpoint, now)  # the first round's time
                self._unplaced[state.endpoint] = (sent, since)
        for other in env.engine_of[self.model.name]:
            if other.name in parked and other.name != self.model.name:
                # The models of one engine agree on what sizes a read (``broker.engines``).
                env.views[other.name] = await self._read(other.name)
        if self.model.name not in parked:
            return snap
        return await self._read(self.model.name)

    def _add_unplaced(self, newcomers_sent: dict[str, int], now: float) -> None:
        """Newcomers sent while an endpoint's capacity was unknown, or beyond its batch,
        may still wait there behind the flood: counted as sent again (for as long as
        metrics stay fresh), so that the take-back stage makes room for them once the
        capacity is learned, a few jobs a round."""
        unplaced, self._unplaced = self._unplaced, {}
        self._carried, self._carried_counts = {}, {}
        for endpoint, (count, at) in unplaced.items():
            if now - at <= self._env.stale_s:
                newcomers_sent[endpoint] = newcomers_sent.get(endpoint, 0) + count
                self._carried[endpoint] = at
                self._carried_counts[endpoint] = count

    async def _read(self, model: str) -> ModelSnapshot:
        s = self.stages
        return await self._env.store.snapshot(model, s.depth, in_engine=s.users_in_engine)

    def _scrape_if_held(self, snap: ModelSnapshot) -> None:
        """Backlog is left and only jobs the last scrape did not show hold an endpoint back:
        scrape it as soon as they can show in its metrics, rather than at the next tick.
        Without this a band whose target is 1 (batch) would get one job per scrape interval,
        and a band held by a burst handed over just before a scrape would wait for the next."""
        scraper = self._env.scraper
        if not self.stages.scraped or scraper is None:
            return
        band = snap.backlogs[0].band
        for state in self.states(snap):
            if held_by_unseen(state, band, self.stages.config):
                scraper.scrape_after(state.endpoint, METRICS_LAG_S + 0.01)

    def _scrape_after_newcomers(
        self, states: Sequence[EndpointState], newcomers_sent: Mapping[str, int]
    ) -> None:
        """Newcomers went to an engine whose KV cache is full: read it again a few steps
        later, whether it put a started request back in its queue ahead of them, which
        the take-back stage then takes out (at the next tick it would wait 200 ms)."""
        if self._env.scraper is None:
            return
        for state in states:
            if newcomers_sent.get(state.endpoint) and state.kv_full and state.tpot_s:
                delay = max(METRICS_LAG_S, _PUT_BACK_STEPS * state.tpot_s)
                self._env.scraper.scrape_after(state.endpoint, delay)

    def _wake_when_paced(
        self, decisions: Sequence[Decision], states: Sequence[EndpointState]
    ) -> None:
        """Refills held by their pace (``dispatcher.pacing``) may go when the next is due:
        wake the model's loop then, as no job need end or start meanwhile. One timer at a
        time."""
        paced = {d.endpoint for d in decisions if d.limit is Limit.REFILL_PACE}
        dues = [st.pace_due_in_s for st in states if st.endpoint in paced and st.pace_due_in_s]
        if not dues or self._env.event is None or self._pace_timer:
            return
        event = self._env.event(self.model.name)

        def wake() -> None:
            self._pace_timer = False
            event.set()

        self._pace_timer = True
        asyncio.get_running_loop().call_later(max(0.0, min(dues)) + _PACE_SLACK_S, wake)

    def _wake_scraper(self, endpoint: str) -> None:
        """A job went to ``endpoint``: read it at the scrape interval again if it was idle."""
        if self._env.scraper is not None:
            self._env.scraper.wake(endpoint)


def _served(decisions: Sequence[Decision]) -> int:
    """Of a round's room, what users already in the engine may take."""
    return sum(d.room_for_served for d in decisions)


def _held(decision: Decision) -> Limit:
    """Why an endpoint with room took no job of a user already in the engine."""
    if decision.limit in (Limit.NEWCOMER_STEP, Limit.REFILL_PACE, Limit.REFILLS_WAITING):
        return decision.limit
    return Limit.BATCH_SLOTS
