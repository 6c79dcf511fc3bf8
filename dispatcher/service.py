"""The dispatcher service: for every owned model, move jobs to the ready stream
while there is backlog and the model's endpoints have room.

Lifecycle (one ``run`` per process): subscribe to the models' wake channels,
run one loop per model, return when ``stop`` is set. A loop dispatches until
the backlog is empty or every endpoint is full, then sleeps until a wake
message (a new job, a job that ended) or the idle tick, whichever comes first:
it reacts to a new job without polling delay, and the tick bounds the damage of
a wake message lost while the subscription reconnects.

Each dispatch returns the model's state after it; when the only news since is
users who became backlogged (named by their wake messages), the next round
plans from that view plus them: a new job on an idle model costs one round trip
to dispatch, not two. The script re-checks every endpoint's cap, so a stale view
can cost fairness for one round at most, never an over-admission.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import DispatchStore, ModelConfig, ModelSnapshot, Newcomer, Settings
from dispatcher.admission import choose_endpoint
from dispatcher.fairness import policy
from dispatcher.wake import WakeListener

log = logging.getLogger(__name__)

_MAX_EMPTY_ROUNDS = 3  # picks that found only emptied queues; each one cleans the backlog


class Dispatcher:
    def __init__(
        self, settings: Settings, redis: Redis, models: Sequence[ModelConfig] | None = None
    ) -> None:
        self._settings = settings
        self._redis = redis
        self._models = tuple(models if models is not None else settings.models)
        self._store = DispatchStore(redis, settings)
        self.dispatched = 0  # jobs moved to ready streams by this process
        self._views: dict[str, ModelSnapshot] = {}  # model -> state after its last dispatch

    async def run(self, stop: asyncio.Event) -> None:
        for model in self._models:
            await self._store.ensure_ready_group(model.name)
        wake = WakeListener(self._redis, [m.name for m in self._models])
        async with asyncio.TaskGroup() as tasks:
            listener = tasks.create_task(wake.run())
            loops = [tasks.create_task(self._model_loop(m, wake, stop)) for m in self._models]
            await stop.wait()
            for task in [listener, *loops]:
                task.cancel()

    async def _model_loop(
        self, model: ModelConfig, wake: WakeListener, stop: asyncio.Event
    ) -> None:
        backoff = 0.05
        event = wake.event(model.name)
        while not stop.is_set():
            event.clear()  # before reading state, so a wake-up during the round is not lost
            try:
                await self.dispatch_model(model, wake.take(model.name))
                backoff = 0.05
            except RedisError as exc:
                log.warning("dispatch for model %s failed (%s); retrying", model.name, exc)
                wake.mark_stale(model.name)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            try:
                await asyncio.wait_for(event.wait(), self._settings.dispatcher_idle_tick_s)
            except TimeoutError:
                wake.mark_stale(model.name)  # the idle tick always reads afresh

    async def dispatch_model(
        self, model: ModelConfig, newcomers: Sequence[Newcomer] | None = None
    ) -> int:
        """Dispatch until the backlog is empty or no endpoint has room; returns the count.

        With ``newcomers`` (users backlogged since the last round) the round plans from
        the view the last dispatch returned, saving a read; None reads the state afresh.
        """
        fair = policy(model.policy)
        depth = model.inflight_cap
        cached = self._views.pop(model.name, None)
        if cached is not None and newcomers is not None:
            snap = cached.with_newcomers(self._settings.bands, newcomers)
        else:
            snap = await self._store.snapshot(model.name, depth)
        total, empty_rounds = 0, 0
        while not snap.empty and empty_rounds < _MAX_EMPTY_ROUNDS:
            admission = choose_endpoint(model.endpoints, snap.inflight, model.inflight_cap)
            if admission is None:
                break
            top = snap.backlogs[0]  # strict priority: only the highest backlogged band
            picks = fair.plan(top.band, top.users, top.join, admission.room)
            dispatched, snap = await self._store.dispatch(
                model.name, admission.endpoint, model.inflight_cap, picks, depth
            )
            total += len(dispatched)
            empty_rounds = 0 if dispatched else empty_rounds + 1
        self._views[model.name] = snap
        self.dispatched += total
        return total
