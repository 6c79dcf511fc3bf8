"""The dispatcher service: for every owned model, move jobs to the ready stream
while there is backlog and the model's endpoints have room.

Lifecycle (one ``run`` per process): subscribe to the models' wake channels,
run one loop per model, return when ``stop`` is set. A loop dispatches until
the backlog is empty or every endpoint is full, then sleeps until a wake
message (a new job, a job that ended) or the idle tick, whichever comes first:
it reacts to a new job without polling delay, and the tick bounds the damage of
a wake message lost while the subscription reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import DispatchStore, ModelConfig, Settings
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

    async def run(self, stop: asyncio.Event) -> None:
        for model in self._models:
            await self._store.ensure_ready_group(model.name)
        wake = WakeListener(self._redis, [m.name for m in self._models])
        async with asyncio.TaskGroup() as tasks:
            listener = tasks.create_task(wake.run())
            loops = [
                tasks.create_task(self._model_loop(m, wake.event(m.name), stop))
                for m in self._models
            ]
            await stop.wait()
            for task in [listener, *loops]:
                task.cancel()

    async def _model_loop(
        self, model: ModelConfig, wake: asyncio.Event, stop: asyncio.Event
    ) -> None:
        backoff = 0.05
        while not stop.is_set():
            wake.clear()  # before reading state, so a wake-up during the round is not lost
            try:
                await self.dispatch_model(model)
                backoff = 0.05
            except RedisError as exc:
                log.warning("dispatch for model %s failed (%s); retrying", model.name, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self._settings.dispatcher_idle_tick_s)

    async def dispatch_model(self, model: ModelConfig) -> int:
        """Dispatch until the backlog is empty or no endpoint has room; returns the count."""
        fair = policy(model.policy)
        total, empty_rounds = 0, 0
        while empty_rounds < _MAX_EMPTY_ROUNDS:
            snap = await self._store.snapshot(model.name, depth=model.inflight_cap)
            if snap.empty:
                break
            admission = choose_endpoint(model.endpoints, snap.inflight, model.inflight_cap)
            if admission is None:
                break
            top = snap.backlogs[0]  # strict priority: only the highest backlogged band
            picks = fair.plan(top.band, top.users, top.join, admission.room)
            dispatched = await self._store.dispatch(model.name, admission.endpoint, picks)
            total += len(dispatched)
            empty_rounds = 0 if dispatched else empty_rounds + 1
        self.dispatched += total
        return total
