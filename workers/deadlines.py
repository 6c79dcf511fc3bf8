"""Queue deadlines: jobs that waited longer than their band allows, or than their own
deadline (a request's ``X-Fairq-Max-Queue-S``: ``broker.deadlines``), end ``expired``.

Every worker runs this loop, but for each model only the one that takes the
turn (a TTL'd ``SET NX PX`` lock that simply lapses, ``take_turn``) sweeps in a
given interval; ``expire.lua`` is atomic per call, so two sweeps at once would
still expire each job once. A waiting client gets its end event at once (408
``job_expired`` from the gateway). Every band is swept, one without a deadline of its own
too: its jobs may have theirs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from redis.exceptions import RedisError

from broker import ExecutionStore, Settings, telemetry

log = logging.getLogger(__name__)


class DeadlineSweeper:
    def __init__(
        self, store: ExecutionStore, settings: Settings, worker: str, models: Sequence[str]
    ) -> None:
        self._store = store
        self._worker = worker
        self._models = list(models)
        self._interval_s = settings.deadline_sweep_s
        limits = settings.queue_deadline_s
        self._deadlines = {
            band: int(limits[band] * 1000) if band in limits else None for band in settings.bands
        }

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except RedisError as exc:
                log.warning("deadline sweep failed (%s); retrying", exc)
            await asyncio.sleep(self._interval_s)

    async def sweep(self) -> list[str]:
        """Expire what is overdue in the models this worker takes the turn for."""
        expired: list[str] = []
        turn_ms = max(1, int(self._interval_s * 1000 * 0.9))  # lapses before the next turn
        for model in self._models:
            if not await self._store.take_turn(model, self._worker, turn_ms):
                continue
            for band, deadline_ms in self._deadlines.items():
                expired += await self._store.expire(model, band, deadline_ms)
        if expired:
            telemetry.EXPIRED.inc(len(expired))
            log.info("expired %d queued job(s) past their deadline", len(expired))
        return expired
