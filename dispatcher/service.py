"""The dispatcher service: for every owned model, move jobs to the ready stream
while there is backlog and the model's endpoints have room.

Lifecycle (one ``run`` per process): subscribe to the models' wake channels,
hold leases on a fair share of the models (``dispatcher.ownership``; any number
of replicas may run), run one loop per owned model, return when ``stop`` is set.
A loop dispatches until the backlog is empty or every endpoint is full, then
sleeps until a wake message (a new job, a job that ended) or the idle tick,
whichever comes first: it reacts to a new job without polling delay, and the
tick bounds the damage of a wake message lost while the subscription reconnects.

Each dispatch returns the model's state after it; when the only news since is
users who became backlogged (named by their wake messages), the next round
plans from that view plus them: a new job on an idle model costs one round trip
to dispatch, not two. The script re-checks every endpoint's cap, so a stale view
can cost fairness for one round at most, never an over-admission.

After each round the model's express grant is refreshed from the same admission
decision (``plan_grant``): new jobs that find nothing queued ahead of them then
go straight to an endpoint from enqueue.lua. A grant is written only when it
changed or is half-way to its expiry, and Redis refuses it if any send happened
since the state it was computed from (``broker.dispatching``).

A model's endpoints are live (``dispatcher.discovery``): the listed ones and those its
DNS records name now. A replica found is scraped at once and admitted to after its
first good scrape; one gone gets nothing more (nor express grants) and is no longer
scraped, while its jobs in flight end where they are or are reclaimed as ever. With no
endpoint, a model's jobs wait in its queue, and while they do its records are read every
``waking_interval_s`` (``_waking``), from the moment a job comes (``_queued``).

Models served by one engine (``broker.engines``: a base model and its LoRA adapters, or
aliases) are owned as one, under the lease of the first of them, and dispatched by one
loop, in turn (``dispatcher.sharing``): each turn's admission counts fairq's jobs of all
of them at each endpoint (``endpoint_states``' ``others``), and only that loop sends to
the engine, so two of the models can never both take the same room. The script's
re-check bounds each model's own count by a cap planned from the whole engine's; no
script crosses models (each touches one model's Redis Cluster slot), so the loop is what
keeps the models in step, and such models get no express grant (enqueue.lua would send
on one model's grant while the loop sends another's jobs into the same room): each of
their jobs waits for one dispatcher round.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import (
    DispatchStore,
    ExpressSend,
    Grant,
    ModelConfig,
    ModelSnapshot,
    Newcomer,
    OwnershipStore,
    Pick,
    Settings,
    Unseen,
    engine_groups,
    stop_task,
    telemetry,
    wait_event,
)
from broker.process.backoff import Backoff
from dispatcher.admission import (
    ADMISSION,
    AdmissionConfig,
    AdmissionPolicy,
    Decision,
    EndpointState,
    Limit,
    held_by_unseen,
    plan_grant,
    refusals,
)
from dispatcher.affinity import assign, open_endpoints, round_room
from dispatcher.discovery import DnsDiscovery, LiveEndpoints
from dispatcher.endpoints import METRICS_LAG_S, RateMeter, SentLog, endpoint_states
from dispatcher.fairness import plan_with_slots, policy
from dispatcher.newcomer_step import NewcomerSteps
from dispatcher.ownership import Ownership
from dispatcher.pacing import Pacer, pace_of
from dispatcher.preemption import Preemption
from dispatcher.scraper import EndpointView, Scraper
from dispatcher.sharing import next_turn
from dispatcher.wake import WakeListener

log = logging.getLogger(__name__)

_MAX_EMPTY_ROUNDS = 3  # picks that found only emptied queues; each one cleans the backlog
_LAZY_ROUND_S = 0.005  # the delay of a round that only refreshes room while nothing is queued
_PACE_SLACK_S = 0.001  # a paced refill's wake-up comes this late, so the step has passed
_MAX_PICKS = 64  # per script call: a huge room (a static cap of 100,000) is served in rounds


@dataclass(frozen=True)
class _Turn:
    """One model's turn on a shared engine: one pass of at most 1/``share`` of the room
    open (at least one job), and at most ``limit`` jobs (0: no bound)."""

    share: int
    limit: int = 0


@dataclass(frozen=True)
class _Written:
    """The last express grant this process wrote for a model."""

    grant: Grant | None
    sequence: int
    at: float  # monotonic


class Dispatcher:
    def __init__(
        self, settings: Settings, redis: Redis, models: Sequence[ModelConfig] | None = None
    ) -> None:
        self._settings = settings
        self._redis = redis
        self._models = tuple(models if models is not None else settings.models)
        # Models served by one engine, owned and dispatched together (the first names them)
        self._engines = engine_groups(self._models)
        self._engine_of = {m.name: group for group in self._engines for m in group}
        self._turns: dict[str, str] = {}  # engine's first model -> the model served last
        self._store = DispatchStore(redis, settings)
        self._sent = SentLog(keep_s=settings.metrics_stale_s * 2)
        self._rates = {m.name: RateMeter() for m in self._models}
        self._scraper: Scraper | None = None
        self._live = LiveEndpoints(self._models)  # model -> its endpoints now
        self._config = {m.name: m for m in self._models}
        self._discovery: DnsDiscovery | None = None  # while ``run`` runs
        self._queued_hooks: list[Callable[[str], None]] = []
        self._wake: WakeListener | None = None  # while ``run`` runs
        self._views: dict[str, ModelSnapshot] = {}  # model -> state after its last dispatch
        self._preemption = Preemption(self._store, self._engine_of, self._views)
        self._grants: dict[str, _Written] = {}
        # model -> endpoint -> express sends of newcomers since its last round (preemption)
        self._express_newcomers: dict[str, dict[str, int]] = {}
        self._newcomer_steps = NewcomerSteps()  # endpoints kept clear for a newcomer's prefill
        self._pacer = Pacer()  # when each endpoint's next refill is due
        self._pace_timers: set[str] = set()  # models with a wake-up due when a pace frees
        self.dispatched = 0  # jobs moved to ready streams by this process
        self.name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.owned: frozenset[str] = frozenset()  # models this replica holds the lease of
        self._loops: dict[str, asyncio.Task[None]] = {}  # engine (its first model) -> its loop

    async def run(self, stop: asyncio.Event) -> None:
        """Dispatch the models this replica owns (``dispatcher.ownership``) until ``stop``."""
        for model in self._models:
            await self._store.ensure_ready_group(model.name)
        shared = [[m.name for m in group] for group in self._engines if len(group) > 1]
        names = [m.name for m in self._models]
        wake = WakeListener(
            self._redis, names, self._express_sent, together=shared, on_queued=self._queued
        )
        self._wake = wake
        async with asyncio.TaskGroup() as tasks:
            self._scraper = self._make_scraper(wake)
            loops = self._loops

            def own(owned: frozenset[str]) -> None:
                self._own(owned, loops, wake, stop, tasks)

            ownership = Ownership(
                OwnershipStore(self._redis),
                [group[0].name for group in self._engines],  # one lease per engine
                self.name,
                self._settings.dispatcher_lease_ms,
                own,
            )
            background = [tasks.create_task(wake.run()), tasks.create_task(ownership.run())]
            if self._scraper is not None:
                background.append(tasks.create_task(self._scraper.run()))
            if any(m.discovery is not None for m in self._models):
                self._discovery = DnsDiscovery(self._models, self._found, waking=self._waking)
                background.append(tasks.create_task(self._discovery.run()))
            await stop.wait()
            # Ownership first: it gives the leases back, so other replicas take over now.
            for task in [background[1], background[0], *background[2:], *loops.values()]:
                await stop_task(task)

    def _own(
        self,
        owned: frozenset[str],
        loops: dict[str, asyncio.Task[None]],
        wake: WakeListener,
        stop: asyncio.Event,
        tasks: asyncio.TaskGroup,
    ) -> None:
        """Start a loop for every engine newly owned (``owned``: the leases held, each named
        by the engine's first model) and stop the loops of those lost."""
        self.owned = frozenset(m.name for g in self._engines if g[0].name in owned for m in g)
        for name in set(loops) - owned:
            loops.pop(name).cancel()
            for model in self._engine_of[name]:
                self._views.pop(model.name, None)
                self._grants.pop(model.name, None)
        for group in self._engines:
            if group[0].name in owned and group[0].name not in loops:
                for model in group:
                    wake.mark_stale(model.name)
                loops[group[0].name] = tasks.create_task(self._model_loop(group, wake, stop))
        self._watch()
        log.info("dispatcher %s owns models: %s", self.name, ", ".join(sorted(owned)) or "none")

    def _watch(self) -> None:
        """Have the scraper read exactly the live endpoints of the models owned."""
        if self._scraper is not None:
            self._scraper.watch(
                [
                    ep
                    for m in self._models
                    if m.name in self.owned and m.admission_policy == "metrics"
                    for ep in self._live.of(m.name)
                ]
            )

    def _found(self, model: str, urls: tuple[str, ...]) -> None:
        """Discovery read ``model``'s records: follow a changed set at once. A new endpoint
        is scraped now (``Scraper.watch``) and admitted to once healthy; a removed one
        leaves the states admission and the express grant are planned from, so the round
        woken here takes its grant back."""
        change = self._live.found(model, urls)
        if not change:
            return
        log.info(
            "endpoints of model %s: %d now (added: %s; removed: %s)",
            model,
            len(self._live.of(model)),
            ", ".join(change.added) or "-",
            ", ".join(change.removed) or "-",
        )
        for endpoint in change.removed:
            if not self._live.models_of(endpoint):
                self._sent.forget(endpoint)
                self._pacer.forget(endpoint)
        self._watch()
        if self._wake is not None:
            self._wake.mark_stale(model)
            self._wake.event(model).set()

    def when_queued(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(model)`` whenever a job of ``model`` comes (queued or sent express),
        as its wake message arrives: the status publisher's cue (``dispatcher.status``)."""
        self._queued_hooks.append(hook)

    def _queued(self, model: str) -> None:
        for hook in self._queued_hooks:
            hook(model)
        if self._discovery is not None and self._waking(model):
            self._discovery.hurry(model)

    def _waking(self, model: str) -> bool:
        """Whether ``model``'s requests wait for a replica: owned here, a backlog (or a job
        came since its last round: ``urgent``), and no healthy endpoint."""
        if model not in self.owned:
            return False
        came = self._wake is not None and self._wake.urgent(model)
        if not came and self._idle(model):
            return False
        live = self._live.of(model)
        if self._config[model].admission_policy != "metrics" or self._scraper is None:
            return not live
        return not any(self._scraper.view(endpoint).healthy for endpoint in live)

    def _make_scraper(self, wake: WakeListener) -> Scraper | None:
        """One scraper for every endpoint of the models admitted by metrics; a finished
        scrape wakes the endpoint's models, since their room may have changed. An idle
        engine is read every half of ``metrics_stale_s``, so its metrics never go stale and
        the first job after idle is admitted on them without waiting for a scrape; a job
        sent to it (``_sent``) brings it back to ``scrape_interval_s`` at once. A busy one
        is read at least as often (the scrape budget's bound)."""
        scraped = {m.name for m in self._models if m.admission_policy == "metrics"}
        if not scraped:
            return None
        # It starts with no endpoints: ``_own`` has it watch those of the models owned.

        def owners(endpoint: str) -> list[str]:
            return [name for name in self._live.models_of(endpoint) if name in scraped]

        def on_update(endpoint: str) -> None:
            for name in owners(endpoint):
                wake.event(name).set()

        async def unseen(endpoint: str) -> Unseen | None:
            lag_ms = int(METRICS_LAG_S * 1000)
            try:
                return await self._store.unseen(owners(endpoint), endpoint, lag_ms)
            except RedisError:
                return None  # the scrape waits for Redis: a sample without it is half a view

        s = self._settings
        return Scraper(
            [],
            interval_s=s.scrape_interval_s,
            idle_interval_s=s.metrics_stale_s / 2,
            timeout_s=s.scrape_timeout_s,
            budget=s.scrape_budget,
            unhealthy_after=s.unhealthy_after_failures,
            on_update=on_update,
            unseen=unseen,
        )

    async def _model_loop(
        self, group: Sequence[ModelConfig], wake: WakeListener, stop: asyncio.Event
    ) -> None:
        """Dispatch one engine's models (most engines serve one) until ``stop``."""
        backoff = Backoff()
        event = wake.event(group[0].name)  # the group's models share it
        names = [m.name for m in group]
        while not stop.is_set() and self._current(group):
            if not any(wake.urgent(n) for n in names) and all(self._idle(n) for n in names):
                # Nothing is queued and no job arrived: the round only refreshes room and
                # the express grant. Let the request that caused this wake-up (an express
                # send, a first token) have the CPU first, and take any others with it.
                await asyncio.sleep(_LAZY_ROUND_S)
            event.clear()  # before reading state, so a wake-up during the round is not lost
            try:
                if len(group) == 1:
                    await self.dispatch_model(group[0], wake.take(names[0]))
                else:
                    await self.dispatch_engine(group, {n: wake.take(n) for n in names})
                backoff.reset()
            except RedisError as exc:
                log.warning("dispatch for models %s failed (%s); retrying", names, exc)
                for name in names:
                    wake.mark_stale(name)
                await backoff.wait()
                continue
            if not await wait_event(event, self._settings.dispatcher_idle_tick_s):
                for name in names:
                    wake.mark_stale(name)  # the idle tick always reads afresh

    def _current(self, group: Sequence[ModelConfig]) -> bool:
        """Whether the running task is the engine's loop. A loop cancelled when its lease
        was lost may have had the cancel swallowed (by a library awaited at that moment); it
        must end rather than dispatch beside the loop that replaced it, whose views it
        shares."""
        return self._loops.get(group[0].name) is asyncio.current_task()

    def _idle(self, model: str) -> bool:
        """No backlog in the model's last known state."""
        view = self._views.get(model)
        return view is not None and view.empty

    async def dispatch_model(
        self, model: ModelConfig, newcomers: Sequence[Newcomer] | None = None
    ) -> int:
        """Dispatch until the backlog is empty or no endpoint has room; returns the count.

        With ``newcomers`` (users backlogged since the last round) the round plans from
        the view the last dispatch returned, saving a read; None reads the state afresh.
        """
        return await self._dispatch(model, await self._view(model, newcomers))

    async def dispatch_engine(
        self,
        group: Sequence[ModelConfig],
        newcomers: dict[str, Sequence[Newcomer] | None],
    ) -> int:
        """Dispatch the models of one engine in turn (``dispatcher.sharing``) until none may
        send; returns the count. A cycle of turns splits the room open at its start: its
        first turn takes 1/k of it with k models waiting in the band (at least one job, so
        one job each while the room is small), the others as many. Every model's view is
        brought up to date first: each turn's room counts the jobs of all of them."""
        for model in group:
            self._views[model.name] = await self._view(model, newcomers.get(model.name))
        order = [m.name for m in group]
        bands = self._settings.bands
        done: set[str] = set()  # found no room this round
        cycle: set[str] = set()  # served in this cycle of turns
        chunk = 0  # what this cycle's first turn sent: each other turn's bound
        total = 0
        while True:
            if any(name not in self._views for name in order):
                return total  # the engine's lease was lost during the round (``_own``)
            tops = {
                name: bands.index(view.backlogs[0].band)
                for name in order
                if not (view := self._views[name]).empty
            }
            turn = next_turn(order, tops, self._turns.get(order[0]), done)
            if turn is None:
                break
            if turn in cycle:
                cycle, chunk = set(), 0
            waiting = sum(1 for n, b in tops.items() if b == tops[turn] and n not in done)
            step = _Turn(1, chunk) if chunk else _Turn(waiting)
            model = group[order.index(turn)]
            sent = await self._dispatch(model, self._views.pop(turn), step)
            cycle.add(turn)
            chunk = chunk or sent
            if sent:
                self._turns[order[0]] = turn
                total += sent
            else:
                done.add(turn)
        for model in group:  # revokes, once, a grant written before they shared the engine
            if (kept := self._views.get(model.name)) is None:
                return total  # the engine's lease was lost during the round
            admission = ADMISSION[model.admission_policy]
            config = _admission_config(model, bands)
            await self._refresh_grant(model, kept, admission, config)
        return total

    async def _view(
        self, model: ModelConfig, newcomers: Sequence[Newcomer] | None
    ) -> ModelSnapshot:
        """The model's state: its last view plus ``newcomers``, or read afresh (None)."""
        cached = self._views.pop(model.name, None)
        if cached is not None and newcomers is not None:
            return cached.with_newcomers(self._settings.bands, newcomers)
        depth = _depth(model, _admission_config(model, self._settings.bands))
        return await self._store.snapshot(model.name, depth, in_engine=_batch_rule(model))

    async def _dispatch(
        self, model: ModelConfig, snap: ModelSnapshot, turn: _Turn | None = None
    ) -> int:
        """Send from ``snap`` until the backlog is empty or no endpoint has room, or one
        pass of a ``turn`` of a shared engine; keeps the state after as the model's view."""
        fair = policy(model.policy)
        admission = ADMISSION[model.admission_policy]
        config = _admission_config(model, self._settings.bands)
        depth = _depth(model, config)
        total, empty_rounds = 0, 0
        # endpoint -> jobs of users with none in the engine, sent express since the last
        # round or dispatched in this one
        newcomers_sent = self._express_newcomers.pop(model.name, {})
        while not snap.empty and empty_rounds < _MAX_EMPTY_ROUNDS:
            top = snap.backlogs[0]  # strict priority: only the highest backlogged band
            states = self._states(model, snap)
            decisions = open_endpoints(model.routing, admission, states, top.band, config)
            if not decisions:
                telemetry.refused(
                    model.name, top.band, refusals(admission, states, top.band, config)
                )
                break
            room = min(round_room(model.routing, decisions, len(top.users)), _MAX_PICKS)
            if turn is not None:
                room = min(max(1, room // turn.share), turn.limit or room)
            busy = [user for user, jobs in snap.in_engine.items() if jobs > 0]
            picks = plan_with_slots(
                fair,
                top.band,
                top.users,
                top.join,
                room=room,
                served_room=_served_room(model, decisions, top.users, busy),
                in_engine=busy,
            )
            if not picks:  # no room for users in the engine, and every backlogged one is
                telemetry.refused(model.name, top.band, {d.endpoint: _held(d) for d in decisions})
                self._wake_when_paced(model, decisions, states)
                break
            loads = {s.endpoint: s.inflight for s in states if s.healthy}
            routes = assign(
                model.routing, picks, decisions, loads, busy, load_bound=model.routing_load_bound
            )
            sent = 0
            steps = {s.endpoint: s.tpot_s for s in states}
            for decision, group in routes:
                dispatched, snap = await self._send(
                    model, decision, group, snap=snap, busy=busy, depth=depth, sent=newcomers_sent
                )
                if dispatched and any(p.user not in busy for p in group):
                    self._clear_step(model, decision.endpoint, steps.get(decision.endpoint))
                telemetry.DISPATCHED.labels(model.name, top.band).inc(dispatched)
                sent += dispatched
            total += sent
            empty_rounds = 0 if sent else empty_rounds + 1
            if turn is not None:
                break  # the next model's turn
        if model.preemption:
            snap = await self._make_room(model, snap, config, newcomers_sent)
        self._views[model.name] = snap
        self.dispatched += total
        if not snap.empty:
            self._scrape_if_held(model, snap, config)
        await self._refresh_grant(model, snap, admission, config)
        return total

    async def _send(
        self,
        model: ModelConfig,
        decision: Decision,
        picks: Sequence[Pick],
        *,
        snap: ModelSnapshot,
        busy: Sequence[str],
        depth: int,
        sent: dict[str, int],
    ) -> tuple[int, ModelSnapshot]:
        """Dispatch ``picks`` to the decision's endpoint; the count sent and the state after.
        ``sent`` counts the jobs of users with none in the engine sent to each endpoint."""
        # The script re-checks these bounds against Redis's own counts: a plan from a
        # stale view can never send more than the decision allowed.
        inflight = snap.inflight.get(decision.endpoint, 0)
        served_cap = None
        if decision.served_room is not None:
            served_cap = inflight + decision.room_for_served
        fresh = sum(1 for p in picks if p.user not in busy)
        sent[decision.endpoint] = sent.get(decision.endpoint, 0) + fresh
        rate = self._rates[model.name].rate(time.monotonic())
        dispatched, snap, plain = await self._store.dispatch(
            model.name,
            decision.endpoint,
            inflight + decision.room,
            picks,
            depth,
            engine_priority=model.engine_priority,
            rate=rate,
            served_cap=served_cap,
        )
        # Sent when the script has run (after its reply), so that a scrape whose
        # in-transit count was read before the script always counts these as sent since.
        now = time.monotonic()
        self._sent.record(decision.endpoint, len(dispatched), now, plain)
        self._rates[model.name].record(len(dispatched), now)
        self._paced(model, decision.endpoint, min(len(dispatched), len(picks) - fresh), now)
        if dispatched:
            self._wake_scraper(decision.endpoint)
        return len(dispatched), snap

    def _scrape_if_held(
        self, model: ModelConfig, snap: ModelSnapshot, config: AdmissionConfig
    ) -> None:
        """Backlog is left and only jobs the last scrape did not show hold an endpoint back:
        scrape it as soon as they can show in its metrics, rather than at the next tick.
        Without this a band whose target is 1 (batch) would get one job per scrape interval,
        and a band held by a burst handed over just before a scrape would wait for the next."""
        if model.admission_policy != "metrics" or self._scraper is None:
            return
        band = snap.backlogs[0].band
        for state in self._states(model, snap):
            if held_by_unseen(state, band, config):
                self._scraper.scrape_after(state.endpoint, METRICS_LAG_S + 0.01)

    async def _make_room(
        self,
        model: ModelConfig,
        snap: ModelSnapshot,
        config: AdmissionConfig,
        newcomers_sent: dict[str, int],
    ) -> ModelSnapshot:
        """Preemption after a round (``dispatcher.preemption``). Returns the snapshot to plan
        from next (read again if anything was taken back; so are the other models' views)."""
        states = self._states(model, snap)
        parked = await self._preemption.make_room(model, snap, states, config, newcomers_sent)
        for other in self._engine_of[model.name]:
            if other.name in parked and other.name != model.name:
                self._views[other.name] = await self._view(other, None)
        if model.name not in parked:
            return snap
        return await self._store.snapshot(model.name, _depth(model, config), in_engine=True)

    def _paced(self, model: ModelConfig, endpoint: str, refills: int, now: float) -> None:
        """``refills`` jobs of users already in the engine went to ``endpoint``: its pace's
        schedule moves on (``dispatcher.pacing``)."""
        view = self._scraper.view(endpoint) if self._scraper is not None else None
        pace = pace_of(view.pace) if model.pace_refills and view is not None else None
        if pace is not None:
            self._pacer.sent(endpoint, refills, pace, now)

    def _wake_when_paced(
        self, model: ModelConfig, decisions: Sequence[Decision], states: Sequence[EndpointState]
    ) -> None:
        """Refills held by their pace (``dispatcher.pacing``) may go when the next is due:
        wake the model's loop then, as no job need end or start meanwhile. One timer at a
        time per model."""
        paced = {d.endpoint for d in decisions if d.limit is Limit.REFILL_PACE}
        dues = [s.pace_due_in_s for s in states if s.endpoint in paced and s.pace_due_in_s]
        if not dues or self._wake is None or model.name in self._pace_timers:
            return
        event = self._wake.event(model.name)

        def wake() -> None:
            self._pace_timers.discard(model.name)
            event.set()

        self._pace_timers.add(model.name)
        asyncio.get_running_loop().call_later(max(0.0, min(dues)) + _PACE_SLACK_S, wake)

    def _wake_scraper(self, endpoint: str) -> None:
        """A job went to ``endpoint``: read it at the scrape interval again if it was idle."""
        if self._scraper is not None:
            self._scraper.wake(endpoint)

    def _express_sent(self, model: str, sent: ExpressSend) -> None:
        now = time.monotonic()
        self._sent.record(sent.endpoint, 1, now, int(sent.plain))
        self._rates[model].record(1, now)
        self._wake_scraper(sent.endpoint)
        if sent.newcomer:  # it may wait beyond a full batch: the next round makes room
            pending = self._express_newcomers.setdefault(model, {})
            pending[sent.endpoint] = pending.get(sent.endpoint, 0) + 1
            view = self._scraper.view(sent.endpoint) if self._scraper is not None else None
            self._clear_step(self._config[model], sent.endpoint, view.tpot_s if view else None)

    def _clear_step(self, model: ModelConfig, endpoint: str, step_s: float | None) -> None:
        """A newcomer went to ``endpoint``: keep its prefill step clear of refills
        (``dispatcher.newcomer_step``), timed by the engine's recent step (unknown before a
        scrape shows one: nothing kept then)."""
        if _clears_steps(model) and step_s:
            self._newcomer_steps.hold(endpoint, step_s, time.monotonic())

    async def _refresh_grant(
        self,
        model: ModelConfig,
        snap: ModelSnapshot,
        admission: AdmissionPolicy,
        config: AdmissionConfig,
    ) -> None:
        ttl_s = self._settings.express_grant_ttl_s
        if ttl_s <= 0:
            return
        # Express is for bands more urgent than any backlog: a job of a backlogged band
        # (or a less urgent one) waits its turn anyway, so its credits would go unused.
        bands = self._settings.bands
        usable = bands if snap.empty else bands[: bands.index(snap.backlogs[0].band)]
        states = self._states(model, snap)
        if model.routing == "prefix" and len(states) > 1:
            usable = ()  # one grant is one endpoint: express sends would ignore affinity
        if len(self._engine_of[model.name]) > 1:
            usable = ()  # the engine's room is shared: only the group's loop may use it
        grant = plan_grant(admission, states, usable, config) if usable else None
        now = time.monotonic()
        last = self._grants.get(model.name)
        if last is not None and last.grant == grant:
            unchanged = last.sequence == snap.sequence and now - last.at < ttl_s / 2
            if grant is None or unchanged:
                return
        if await self._store.grant(model.name, grant, snap.sequence, int(ttl_s * 1000)):
            self._grants[model.name] = _Written(grant, snap.sequence, now)

    @property
    def models(self) -> tuple[ModelConfig, ...]:
        return self._models

    def endpoint_states(self, model: ModelConfig, snap: ModelSnapshot) -> list[EndpointState]:
        """What admission knows about each endpoint of the model now (for status)."""
        return self._states(model, snap)

    def engine_view(self, model: ModelConfig, endpoint: str) -> EndpointView | None:
        """The scraper's latest view of an endpoint; None where the model is not scraped."""
        if model.admission_policy != "metrics" or self._scraper is None:
            return None
        return self._scraper.view(endpoint)

    def _states(self, model: ModelConfig, snap: ModelSnapshot) -> list[EndpointState]:
        views = None
        if model.admission_policy == "metrics" and self._scraper is not None:
            views = {ep: self._scraper.view(ep) for ep in self._live.of(model.name)}
        others = [
            view
            for m in self._engine_of[model.name]
            if m.name != model.name and (view := self._views.get(m.name)) is not None
        ]
        now = time.monotonic()
        return endpoint_states(
            self._live.of(model.name),
            snap,
            views,
            self._sent,
            now=now,
            stale_s=self._settings.metrics_stale_s,
            others=others,
            clearing=self._newcomer_steps.clearing(now) if _clears_steps(model) else (),
            pacer=self._pacer if model.pace_refills else None,
        )


def _admission_config(model: ModelConfig, bands: Sequence[str]) -> AdmissionConfig:
    return AdmissionConfig.of(model, bands)


def _depth(model: ModelConfig, config: AdmissionConfig) -> int:
    """Backlogged users a round reads per band. A plan never has more picks than this, so
    the lowest ``depth`` users are enough: reading more would make a round cost
    O(backlogged users)."""
    return min(max(model.inflight_cap, *config.targets.values()), _MAX_PICKS)


def _served_room(
    model: ModelConfig,
    decisions: Sequence[Decision],
    backlog: Sequence[tuple[str, float]],
    busy: Sequence[str],
) -> int:
    """Of a round's room, what users already in the engine may take: none while a newcomer
    is backlogged where its prefill step is kept clear (it is sent alone, then the step
    holds them back)."""
    if _clears_steps(model) and any(user not in busy for user, _ in backlog):
        return 0
    return sum(d.room_for_served for d in decisions)


def _held(decision: Decision) -> Limit:
    """Why an endpoint with room took no job of a user already in the engine."""
    if decision.limit in (Limit.NEWCOMER_STEP, Limit.REFILL_PACE, Limit.REFILLS_WAITING):
        return decision.limit
    return Limit.BATCH_SLOTS


def _clears_steps(model: ModelConfig) -> bool:
    """Whether a newcomer's prefill step is kept clear of refills (``dispatcher.newcomer_step``):
    it needs the batch rule, which tells newcomers from users in the engine."""
    return model.clear_newcomer_step and _batch_rule(model)


def _batch_rule(model: ModelConfig) -> bool:
    """Whether admission may bound users by the engine's batch (then a round needs to know
    which backlogged users have jobs in the engine)."""
    return model.admission_policy == "metrics" and model.batch_slots != 0
