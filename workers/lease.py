"""The lease on running jobs: renew this worker's, take over those of dead workers.

One loop per worker, every ``lease_renew_ms``:

1. renew every ready entry the worker holds (``renew.lua``: one call per model,
   all in one pipeline, so the cost does not grow with chunks or jobs), and drop
   the jobs whose entries it learns it has lost;
2. take over entries idle for longer than ``lease_ms`` (their worker died) while
   it has free slots (``reclaim.lua``), and hand each to the worker with the
   decision made for it (retry, fail, dead letter);
3. about once a minute, remove the consumer names that dead workers left in the
   ready groups (``forget.lua``: idle ``forget_consumer_after_ms``, nothing
   pending), so the groups do not grow with every worker ever started.

Ownership is documented in ``broker.execution``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from redis.exceptions import RedisError

from broker import Claimed, ExecutionStore, Settings
from broker.execution import Reclaimed

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(
        self, store: ExecutionStore, settings: Settings, worker: str, models: Sequence[str]
    ) -> None:
        self._store = store
        self._settings = settings
        self._worker = worker
        self._models = list(models)
        self._forgot_at = time.monotonic()  # not at once: a fresh worker has work to do

    async def run(
        self,
        held: Callable[[], Mapping[str, Claimed]],
        free_slots: Callable[[], int],
        on_lost: Callable[[str], None],
        on_reclaimed: Callable[[Reclaimed], Awaitable[None]],
    ) -> None:
        """Renew and reclaim forever (cancel the task to stop)."""
        interval_s = self._settings.lease_renew_ms / 1000
        while True:
            try:
                await self._renew(held(), on_lost)
                for model in self._models:
                    free = free_slots()
                    if free <= 0:
                        break
                    for taken in await self._store.reclaim(model, self._worker, free):
                        await on_reclaimed(taken)
                await self._forget_gone_workers()
            except RedisError as exc:
                # Renewals that fail for a whole lease lose the jobs: renew.lua reports
                # them as lost on the next call that gets through.
                log.warning("lease renewal failed (%s); retrying", exc)
            await asyncio.sleep(interval_s)

    async def _forget_gone_workers(self) -> None:
        if time.monotonic() - self._forgot_at < self._settings.forget_every_ms / 1000:
            return
        self._forgot_at = time.monotonic()
        for model in self._models:
            gone = await self._store.forget_gone_consumers(model)
            if gone:
                log.info(
                    "model %s: removed %d gone workers' names from the ready group",
                    model,
                    len(gone),
                )

    async def _renew(self, jobs: Mapping[str, Claimed], on_lost: Callable[[str], None]) -> None:
        if not jobs:
            return
        by_model: dict[str, list[bytes]] = {}
        by_entry: dict[bytes, str] = {}
        for job_id, job in jobs.items():
            by_model.setdefault(job.model, []).append(job.entry_id)
            by_entry[job.entry_id] = job_id
        for entry in await self._store.renew(self._worker, by_model):
            lost = by_entry.get(entry)
            if lost is not None:
                on_lost(lost)
