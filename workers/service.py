"""The worker service: claim dispatched jobs and run many of them at once.

Lifecycle (one ``run`` per process): start the result writer and the cancel
listener, claim ready entries while fewer than ``concurrency`` jobs run, and on
``stop`` claim nothing more, give running jobs ``drain_timeout_s`` to finish,
fail the rest ("worker shut down") and flush the writer before returning.

A claimed entry stays pending in the consumer group until its job is terminal
(``complete.lua`` acknowledges it), so a job is never lost between the read
and the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Sequence

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import Claimed, ExecutionStore, JobState, ModelConfig, Outcome, Settings
from workers.cancel import CancelListener
from workers.runner import JobRunner
from workers.writer import ResultWriter

log = logging.getLogger(__name__)

_CLAIM_BLOCK_MS = 1000


def worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        redis: Redis,
        blocking: Redis,
        models: Sequence[ModelConfig] | None = None,
        concurrency: int | None = None,
    ) -> None:
        self._settings = settings
        self._blocking = blocking  # dedicated connection for XREADGROUP BLOCK
        self._models = [m.name for m in (models if models is not None else settings.models)]
        self._concurrency = concurrency or settings.worker_concurrency
        self._store = ExecutionStore(redis, settings)
        self._writer = ResultWriter(self._store, settings.stream_linger_ms)
        self._cancels = CancelListener(redis, self._store.cancel_channels(self._models))
        self._running: dict[str, asyncio.Task[None]] = {}
        self._cancelled: set[str] = set()  # jobs whose owner cancelled them (not shutdown)
        self._slot_freed = asyncio.Event()
        self.name = worker_name()

    async def run(self, stop: asyncio.Event) -> None:
        await self._store.ensure_groups(self._models)
        await self._store.load_scripts()
        timeout = httpx.Timeout(
            self._settings.engine_read_timeout_s, connect=self._settings.engine_connect_timeout_s
        )
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=self._concurrency)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
            runner = JobRunner(self._writer, http)
            writer = asyncio.create_task(self._writer.run(), name="result-writer")
            cancels = asyncio.create_task(self._cancels.run(self._cancel_job), name="cancels")
            try:
                await self._claim_loop(runner, stop)
                await self._drain()
            finally:
                for task in (writer, cancels):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _claim_loop(self, runner: JobRunner, stop: asyncio.Event) -> None:
        backoff = 0.05
        while not stop.is_set():
            free = self._concurrency - len(self._running)
            if free <= 0:
                self._slot_freed.clear()
                await _wait(self._slot_freed, 1.0)
                continue
            try:
                claimed = await self._store.claim(
                    self._blocking, self._models, self.name, free, _CLAIM_BLOCK_MS
                )
                backoff = 0.05
            except RedisError as exc:
                log.warning("claiming jobs failed (%s); retrying in %.2fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            for entry in claimed:
                task = asyncio.create_task(self._run_claimed(runner, entry))
                self._running[entry.job_id] = task
                task.add_done_callback(lambda _t, job_id=entry.job_id: self._release(job_id))

    def _release(self, job_id: str) -> None:
        self._running.pop(job_id, None)
        self._slot_freed.set()

    async def _run_claimed(self, runner: JobRunner, job: Claimed) -> None:
        # The engine call starts at once; start.lua runs alongside it (one round trip
        # less before the first token) and may tell us the job ended meanwhile.
        run = asyncio.ensure_future(runner.run(job))
        try:
            attempt = await self._start(job)
        except BaseException:  # the job was cancelled meanwhile (or the worker stops)
            run.cancel()  # either way the entry stays pending or is acked: nothing is lost
            self._cancelled.discard(job.job_id)
            self._writer.discard(job.job_id)
            raise
        if attempt is None:  # cancelled while it waited in the ready stream
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            self._writer.discard(job.job_id)
            return
        try:
            outcome = await run
        except asyncio.CancelledError:
            if job.job_id in self._cancelled:  # cancel.lua has ended the job already
                self._cancelled.discard(job.job_id)
                self._writer.discard(job.job_id)
                raise
            outcome = Outcome(JobState.FAILED, error=_SHUTDOWN_ERROR)
        except Exception as exc:  # a bug must not leave the job running forever
            log.exception("job %s crashed the runner", job.job_id)
            outcome = Outcome(JobState.FAILED, error=_internal_error(exc))
        await self._writer.finish(job, outcome)

    async def _start(self, job: Claimed) -> int | None:
        """start.lua, retried while Redis is unreachable (a restart): a job given up here
        would stay ``dispatched`` with its entry pending and nobody running it. A retry
        after a lost reply is safe: start.lua answers its own worker as it did before."""
        backoff = 0.05
        while True:
            try:
                return await self._store.start(job, self.name)
            except RedisError as exc:
                log.warning("starting job %s failed (%s); retrying in %.2fs", job.job_id,
                            exc, backoff)  # fmt: skip
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _cancel_job(self, job_id: str) -> None:
        task = self._running.get(job_id)
        if task is not None:
            self._cancelled.add(job_id)
            task.cancel()

    async def _drain(self) -> None:
        """Let running jobs finish within the drain timeout; fail what is left."""
        pending = list(self._running.values())
        if pending:
            _, late = await asyncio.wait(pending, timeout=self._settings.worker_drain_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self._writer.drain()


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)


_SHUTDOWN_ERROR: dict[str, object] = {
    "message": "the worker shut down before the job finished; please retry",
    "type": "server_error",
    "code": "worker_shutdown",
    "status": 503,
}


def _internal_error(exc: Exception) -> dict[str, object]:
    return {
        "message": f"the worker failed while running the job: {type(exc).__name__}",
        "type": "server_error",
        "code": "worker_error",
        "status": 500,
    }
