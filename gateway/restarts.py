"""Requests whose jobs a Redis restart lost end with an error instead of waiting forever.

Redis acknowledges a write before its append-only file is fsynced (``appendfsync
everysec``): a power loss can take the last second of writes with it, among them
jobs this gateway queued and now follows. Nothing would ever be written to their
result streams, so their clients would wait, fed only keep-alives. The watch reads
the server's ``run_id`` every ``interval_s`` (on a cluster, every master's); when one
changes (a Redis restarted), every followed job that Redis no longer knows gets a
``failed`` end event with a 503 ``job_lost`` error: retrying the request is safe,
since it will not run.

A plain restart (clean, or a killed process: the kernel still has the file)
loses nothing, and the check then finds every job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from broker import job_fields, keys
from broker.jobs import JobState, model_of
from broker.process.mailbox import Mailbox
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
        followed: Mapping[str, Mailbox[ResultEvent]],
        interval_s: float = 1.0,
    ) -> None:
        self._redis = redis
        self._followed = followed  # job id -> its events' mailbox, owned by the Gateway
        self._interval_s = interval_s
        self._run_ids: dict[str, str] | None = None  # node -> its server's run id

    async def run(self) -> None:
        while True:
            with contextlib.suppress(RedisError):  # Redis is down: read again when it is back
                await self.check()
            await asyncio.sleep(self._interval_s)

    async def check(self) -> int:
        """Read the run ids; after a restart, end the followed jobs that are gone (count)."""
        run_ids = await self.run_ids()
        previous, self._run_ids = self._run_ids, run_ids
        if not restarted(previous, run_ids):
            return 0
        return await self._end_lost()

    async def run_ids(self) -> dict[str, str]:
        """Each server's run id: the one server's, or every cluster master's by node."""
        if isinstance(self._redis, RedisCluster):
            replies = await self._redis.info("server", target_nodes=RedisCluster.PRIMARIES)
            return {node: str(info["run_id"]) for node, info in replies.items()}
        return {"": str((await self._redis.info("server"))["run_id"])}

    async def _end_lost(self) -> int:
        jobs = [(job_id, model_of(job_id)) for job_id in list(self._followed)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id, model in jobs:
                # Its state, not the key: a worker's late write must not pass for the job.
                pipe.hexists(keys.job(model or "", job_id), job_fields.STATE)
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


def restarted(previous: Mapping[str, str] | None, now: Mapping[str, str]) -> bool:
    """True when the servers are not the ones read last time: a run id changed (a
    restart), or a master appeared or left (a failover, whose new master may lack the
    last writes). Checking is safe when nothing was lost: only jobs Redis no longer
    knows are ended. The first read has nothing to compare with."""
    return previous is not None and dict(previous) != dict(now)
