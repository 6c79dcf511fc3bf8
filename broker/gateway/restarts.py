"""Requests whose jobs a Redis restart lost end with an error instead of waiting forever.

Redis acknowledges a write before its append-only file is fsynced (``appendfsync
everysec``): a power loss can take the last second of writes with it, among them
jobs this gateway queued and now follows. Nothing would ever be written to their
result streams, so their clients would wait, fed only keep-alives. The watch reads
the server's ``run_id`` every ``interval_s``; when it changes (Redis restarted),
every followed job that Redis no longer knows gets a ``failed`` end event with a
503 ``job_lost`` error: retrying the request is safe, since it will not run.

A plain restart (clean, or a killed process: the kernel still has the file)
loses nothing, and the check then finds every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import keys
from broker.jobs import JobState, model_of
from broker.results import ResultEvent

log = logging.getLogger(__name__)

LOST = ResultEvent(
    b"job-lost",
    end=JobState.FAILED,
    error={
        "message": "Redis restarted and lost this request's job (it was accepted in the "
        "last second before a crash); it will not run: retry it",
        "type": "server_error",
        "code": "job_lost",
        "status": 503,
    },
)


class RestartWatch:
    """Ends the followed jobs a Redis restart lost (one per gateway process)."""

    def __init__(
        self,
        redis: Redis,
        followed: Mapping[str, asyncio.Queue[ResultEvent]],
        interval_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._followed = followed  # job id -> its event queue, owned by the Gateway
        self._interval_s = interval_s
        self._run_id: str | None = None

    async def run(self) -> None:
        while True:
            with contextlib.suppress(RedisError):  # Redis is down: read again when it is back
                await self.check()
            await asyncio.sleep(self._interval_s)

    async def check(self) -> int:
        """Read the run id; after a restart, end the followed jobs that are gone (count)."""
        run_id = str((await self._redis.info("server"))["run_id"])
        previous, self._run_id = self._run_id, run_id
        if previous is None or previous == run_id:
            return 0
        return await self._end_lost()

    async def _end_lost(self) -> int:
        jobs = [(job_id, model_of(job_id)) for job_id in list(self._followed)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id, model in jobs:
                # Its state, not the key: a worker's late write must not pass for the job.
                pipe.hexists(keys.job(model or "", job_id), "st")
            found = await pipe.execute()
        lost = 0
        for (job_id, _), exists in zip(jobs, found, strict=True):
            events = self._followed.get(job_id)
            if not exists and events is not None:
                events.put_nowait(LOST)
                lost += 1
        if lost:
            log.warning("Redis restarted and lost %d job(s) this gateway followed", lost)
        return lost
