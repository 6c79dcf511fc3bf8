"""The dispatcher service: for every owned model, move jobs to the ready stream
while there is backlog and the model's endpoints have room.

Lifecycle (one ``run`` per process): subscribe to the models' wake channels,
hold leases on a fair share of the models (``dispatcher.ownership``; any number
of replicas may run), run one loop per owned model, return when ``stop`` is set.
A loop dispatches until the backlog is empty or every endpoint is full, then
sleeps until a wake message (a new job, a job that ended) or the idle tick,
whichever comes first: it reacts to a new job without polling delay, and the
tick bounds the damage of a wake message lost while the subscription reconnects.

Each round (``dispatcher.round``, over the stages ``dispatcher.stages`` chose for the
model at start) returns the model's state after it; when the only news since is users
who became backlogged (named by their wake messages), the next round plans from that
view plus them: a new job on an idle model costs one round trip to dispatch, not two.

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
from collections.abc import Callable, Sequence

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import (
    DispatchStore,
    ExpressSend,
    ModelConfig,
    ModelSnapshot,
    Newcomer,
    OwnershipStore,
    Settings,
    Unseen,
    engine_groups,
    stop_task,
    wait_event,
)
from broker.process.backoff import Backoff
from dispatcher.admission import EndpointState
from dispatcher.discovery import DnsDiscovery, LiveEndpoints
from dispatcher.endpoints import METRICS_LAG_S, SentLog
from dispatcher.express import GrantWriter
from dispatcher.newcomer_step import NewcomerSteps
from dispatcher.ownership import Ownership
from dispatcher.pacing import Pacer
from dispatcher.preemption import Preemption
from dispatcher.round import Round, RoundEnv, Turn
from dispatcher.scraper import EndpointView, Scraper
from dispatcher.sharing import next_turn
from dispatcher.stages import Shared, build
from dispatcher.wake import WakeListener

log = logging.getLogger(__name__)

_LAZY_ROUND_S = 0.005  # the delay of a round that only refreshes room while nothing is queued


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
        self._live = LiveEndpoints(self._models)  # model -> its endpoints now
        self._env = RoundEnv(
            self._store,
            self._live,
            SentLog(keep_s=settings.metrics_stale_s * 2),
            settings.metrics_stale_s,
            self._engine_of,
        )
        self._views = self._env.views  # model -> state after its last dispatch
        self._pacer = Pacer()  # when each endpoint's next refill is due
        shared = Shared(
            NewcomerSteps(), self._pacer, Preemption(self._store, self._engine_of, self._views)
        )
        self._grants = GrantWriter(self._store, settings.bands, settings.express_grant_ttl_s)
        self._rounds = {
            m.name: Round(m, build(m, settings.bands, shared), self._env, self._grants)
            for m in self._models
        }
        self._discovery: DnsDiscovery | None = None  # while ``run`` runs
        self._queued_hooks: list[Callable[[str], None]] = []
        self._wake: WakeListener | None = None  # while ``run`` runs
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
        self._env.event = wake.event
        async with asyncio.TaskGroup() as tasks:
            self._env.scraper = self._make_scraper(wake)
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
            if self._env.scraper is not None:
                background.append(tasks.create_task(self._env.scraper.run()))
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
                self._grants.forget(model.name)
        for group in self._engines:
            if group[0].name in owned and group[0].name not in loops:
                for model in group:
                    wake.mark_stale(model.name)
                loops[group[0].name] = tasks.create_task(self._model_loop(group, wake, stop))
        self._watch()
        log.info("dispatcher %s owns models: %s", self.name, ", ".join(sorted(owned)) or "none")

    def _watch(self) -> None:
        """Have the scraper read exactly the live endpoints of the models owned."""
        if self._env.scraper is not None:
            self._env.scraper.watch(
                [
                    ep
                    for m in self._models
                    if m.name in self.owned and self._rounds[m.name].stages.scraped
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
                self._env.sent.forget(endpoint)
                self._pacer.forget(endpoint)
        self._watch()
        if self._wake is not None:
            self._wake.mark_stale(model)
            self._wake.event(model).set()

    def when_queued(self, hook: Callable[[str], None]) -> None:
        """Call ``hook(model)`` whenever a job of ``model`` comes (queued or sent express),
        as its wake message arrives: the status publisher's cue (``dispatcher.publisher``)."""
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
        views = [self._rounds[model].view(endpoint) for endpoint in live]
        if any(view is None for view in views):
            return not live  # not scraped: any endpoint will do
        return not any(view is not None and view.healthy for view in views)

    def _make_scraper(self, wake: WakeListener) -> Scraper | None:
        """One scraper for every endpoint of the models admitted by metrics; a finished
        scrape wakes the endpoint's models, since their room may have changed. An idle
        engine is read every half of ``metrics_stale_s``, so its metrics never go stale and
        the first job after idle is admitted on them without waiting for a scrape; a job
        sent to it (``_sent``) brings it back to ``scrape_interval_s`` at once. A busy one
        is read at least as often (the scrape budget's bound)."""
        scraped = {name for name, r in self._rounds.items() if r.stages.scraped}
        if not scraped:
            return None
        # It starts with no endpoints: ``_own`` has it watch those of the models owned.

        def owners(endpoint: str) -> list[str]:
            return [name for name in self._live.models_of(endpoint) if name in scraped]

        def on_update(endpoint: str) -> None:
            for name in owners(endpoint):
                wake.event(name).set()

        async def unseen(endpoint: str, start_s: float) -> Unseen | None:
            lag_ms, start_ms = int(METRICS_LAG_S * 1000), int(start_s * 1000)
            try:
                return await self._store.unseen(owners(endpoint), endpoint, lag_ms, start_ms)
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
        sent = await self._rounds[model.name].run(await self._view(model, newcomers))
        self.dispatched += sent
        return sent

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
            step = Turn(1, chunk) if chunk else Turn(waiting)
            sent = await self._rounds[turn].run(self._views.pop(turn), step)
            self.dispatched += sent
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
            await self._rounds[model.name].refresh_grant(kept)
        return total

    async def _view(
        self, model: ModelConfig, newcomers: Sequence[Newcomer] | None
    ) -> ModelSnapshot:
        """The model's state: its last view plus ``newcomers``, or read afresh (None)."""
        cached = self._views.pop(model.name, None)
        if cached is not None and newcomers is not None:
            return cached.with_newcomers(self._settings.bands, newcomers)
        stages = self._rounds[model.name].stages
        return await self._store.snapshot(
            model.name, stages.depth, in_engine=stages.users_in_engine
        )

    def _express_sent(self, model: str, sent: ExpressSend) -> None:
        self._rounds[model].express_sent(sent)

    @property
    def models(self) -> tuple[ModelConfig, ...]:
        return self._models

    def endpoint_states(self, model: ModelConfig, snap: ModelSnapshot) -> list[EndpointState]:
        """What admission knows about each endpoint of the model now (for status)."""
        return self._rounds[model.name].states(snap)

    def engine_view(self, model: ModelConfig, endpoint: str) -> EndpointView | None:
        """The scraper's latest view of an endpoint; None where the model is not scraped."""
        return self._rounds[model.name].view(endpoint)
