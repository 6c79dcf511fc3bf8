"""The per-process resources every route shares, opened and closed by the lifespan.

One Redis client (pooled) for commands, one ``ResultReader`` that follows every
job this process waits for over a single blocking connection, one ``JobQueue``,
one ``KeyRing`` and the ``ServiceTiers``. Work that must outlive the request that
started it (the cancel of a job whose client has left) runs as a tracked task, so
that shutdown can wait for it before closing Redis.

Shutdown, in order: ``drain`` (called by ``server`` as soon as a signal arrives)
ends every request whose job is still queued with a "shutting down" error, so
its client can retry elsewhere at once instead of waiting out the graceful
period; jobs already at a worker keep streaming. Then uvicorn waits for the
responses in flight, and the lifespan's ``close`` waits for their cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from fastapi import Request
from redis.asyncio import Redis

from broker.auth import KeyRing
from broker.errors import FairqError
from broker.jobs import JobState
from broker.process.mailbox import Mailbox
from broker.process.tasks import stop_task
from broker.queue import JobQueue
from broker.redis.connect import connect, lean_link
from broker.result_readers import result_reader
from broker.results import ResultEvent
from broker.settings import Settings
from broker.tiers import ServiceTiers
from gateway.outcomes import SHUTDOWN
from gateway.restarts import RestartWatch

log = logging.getLogger(__name__)

# The reader's XREAD blocks this long at most; the socket timeout outlasts it.
_READER_BLOCK_S = 2
_CLEANUP_TIMEOUT_S = 5.0


class Gateway:
    """What the routes need; one per process (see ``opened``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keyring = KeyRing(settings)
        self.tiers = ServiceTiers.of(settings)
        self.redis: Redis = connect(settings, settings.redis_command_timeout_s)
        # Every request's enqueue.lua, pipelined with the others in flight (broker.redis.resp).
        self._link = lean_link(settings)
        self.queue = JobQueue(self.redis, settings, self._link)
        self.reader = result_reader(settings, self.redis, _READER_BLOCK_S, self._link)
        self._tasks: set[asyncio.Task[None]] = set()
        self._followed: dict[str, Mailbox[ResultEvent]] = {}  # job id -> its events
        self._released = asyncio.Event()
        self._restarts = RestartWatch(self.redis, self._followed)
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.reader.start()
        self._watch = asyncio.create_task(self._restarts.run(), name="restart-watch")

    def track(self, job_id: str, events: Mailbox[ResultEvent]) -> None:
        self._followed[job_id] = events

    def untrack(self, job_id: str) -> None:
        del self._followed[job_id]
        self._released.set()

    async def drain(self) -> None:
        """End the requests whose jobs are still queued (their release cancels the jobs)."""
        for job_id, events in list(self._followed.items()):
            try:
                job = await self.queue.get(job_id, None)
            except FairqError:
                continue
            if job.state is JobState.QUEUED:
                events.put_nowait(SHUTDOWN)

    async def close(self) -> None:
        # uvicorn cancels the requests still running after its graceful timeout and
        # starts the lifespan shutdown at once: their cleanup has not begun yet.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLEANUP_TIMEOUT_S):
                while self._followed:
                    self._released.clear()
                    await self._released.wait()
                if self._tasks:
                    await asyncio.wait(self._tasks)
        if self._watch is not None:
            await stop_task(self._watch)
        await self.reader.close()
        if self._link is not None:
            self._link.close()
        await self.redis.aclose()

    async def finish(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` to its end even if the awaiting request is being cancelled.

        Starlette cancels a streaming response's task scope when the client leaves,
        and anyio re-cancels every await inside that scope: cleanup awaited there
        would never reach Redis. A separate task is outside the scope.
        """
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        # A failure is logged by _done; the request itself has nothing left to report.
        with contextlib.suppress(Exception):
            await asyncio.shield(task)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("gateway cleanup task failed", exc_info=task.exception())


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


@contextlib.asynccontextmanager
async def opened(settings: Settings) -> AsyncIterator[Gateway]:
    """The gateway's resources for the lifetime of the app."""
    gateway = Gateway(settings)
    gateway.start()
    try:
        yield gateway
    finally:
        await gateway.close()
