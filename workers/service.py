"""The worker service: claim dispatched jobs and run many of them at once.

Lifecycle (one ``run`` per process): start the result writer, the cancel
listener, the lease keeper and the deadline sweeper, claim ready entries while
fewer than ``concurrency`` jobs run, and on ``stop`` claim nothing more (and
reclaim nothing more), give running jobs ``drain_timeout_s`` to finish while
their leases are still renewed, fail the rest ("worker shut down") and flush
the writer before returning.

A claimed entry stays pending in the consumer group until its job is terminal
(``complete.lua`` acknowledges it), so a job is never lost between the read
and the end; if this process dies, another worker takes the entry over once
its lease lapses (``workers.lease``; ownership in ``broker.execution``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Collection, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import (
    Claimed,
    ExecutionStore,
    JobState,
    ModelConfig,
    Outcome,
    Reclaim,
    Reroute,
    Settings,
    lean_link,
    stop_task,
    telemetry,
    wait_event,
)
from broker.execution import Reclaimed
from broker.failure_text import failed_status
from broker.process.backoff import Backoff
from broker.redis.cluster import SlotConnections, slot_groups
from workers.cancel import CancelListener
from workers.deadlines import DeadlineSweeper
from workers.engine import open_client
from workers.errors import EngineError, no_engine_took
from workers.lease import LeaseKeeper
from workers.runner import HandBack, JobRunner, backoff_s
from workers.telemetry import WorkerTelemetry
from workers.writer import ResultWriter

log = logging.getLogger(__name__)

_START_AFTER_SENT_S = 0.05  # the longest start.lua waits for the engine call

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
        self._redis = redis  # finds the master of each slot (a cluster)
        self._blocking = blocking  # dedicated connection for XREADGROUP BLOCK
        self._models = [m.name for m in (models if models is not None else settings.models)]
        self._concurrency = concurrency or settings.worker_concurrency
        self._results = lean_link(settings)  # the result writer's flushes and start.lua
        self._store = ExecutionStore(redis, settings, self._results)
        self._writer = ResultWriter(self._store, settings.stream_linger_ms)
        self._cancels = CancelListener(redis, self._store.cancel_channels(self._models))
        self._running: dict[str, asyncio.Task[None]] = {}
        self._jobs: dict[str, Claimed] = {}  # the ready entries this worker holds
        # Jobs to write nothing more for: cancelled by their owner (cancel.lua ended them),
        # or lost with the lease (another worker owns them now). Not shutdown.
        self._dropped: set[str] = set()
        self._finishing: set[str] = set()  # outcome handed to the writer (its ack may be out)
        self._stopping = False
        self._slot_freed = asyncio.Event()
        self._reserved = 0  # places held by claim lanes blocked in a read
        self.name = worker_name()
        self._lease = LeaseKeeper(self._store, settings, self.name, self._models)
        self._sweeper = DeadlineSweeper(self._store, settings, self.name, self._models)
        self.telemetry = WorkerTelemetry()

    @property
    def running(self) -> Collection[str]:
        """Ids of the jobs this worker runs now."""
        return self._running.keys()

    async def run(self, stop: asyncio.Event) -> None:
        await self._store.ensure_groups(self._models)
        await self._store.load_scripts()
        async with open_client(self._settings) as http:
            runner = JobRunner(self._writer, http, self._settings, self._store.written)
            background = [
                asyncio.create_task(self._writer.run(), name="result-writer"),
                asyncio.create_task(self._cancels.run(self._cancel_job), name="cancels"),
                asyncio.create_task(self._keep_leases(runner), name="leases"),
                asyncio.create_task(self._sweeper.run(), name="deadlines"),
            ]
            try:
                await self._claim_loop(runner, stop)
                self._stopping = True
                await self._drain()
            finally:
                for task in background:
                    await stop_task(task)
                if self._results is not None:
                    self._results.close()

    def _keep_leases(self, runner: JobRunner) -> Coroutine[Any, Any, None]:
        async def on_reclaimed(taken: Reclaimed) -> None:
            self._take_over(runner, taken)

        return self._lease.run(
            lambda: self._jobs,
            lambda: 0 if self._stopping else self._concurrency - len(self._running),
            self._lose,
            on_reclaimed,
        )

    async def _claim_loop(self, runner: JobRunner, stop: asyncio.Event) -> None:
        """Claim while running; one lane per group of models one XREADGROUP may name
        (all of them on a single Redis; one hash slot each on a cluster)."""
        if not self._settings.redis_cluster:
            lane = _Lane(self._models, self._concurrency, self._blocking)
            await self._claim_lane(runner, stop, lane)
            return
        groups = slot_groups(self._models, cluster=True)
        share = -(-self._concurrency // len(groups))  # a lane claims at most its share at once
        connections = SlotConnections(self._settings, self._redis, _CLAIM_BLOCK_MS / 1000)
        try:
            async with asyncio.TaskGroup() as lanes:
                for models in groups:
                    lane = _Lane(models, share, connections=connections)
                    lanes.create_task(self._claim_lane(runner, stop, lane))
        finally:
            await connections.aclose()

    async def _claim_lane(self, runner: JobRunner, stop: asyncio.Event, lane: _Lane) -> None:
        models, share = lane.models, lane.share
        backoff = Backoff()
        while not stop.is_set():
            # Free places are reserved before the blocking read: lanes reading at the
            # same time never claim more jobs together than the worker may run.
            free = min(share, self._concurrency - len(self._running) - self._reserved)
            if free <= 0:
                self._slot_freed.clear()
                await wait_event(self._slot_freed, 1.0)
                continue
            self._reserved += free
            try:
                blocking = await lane.connection()
                if lane.recover:
                    claimed, lane.recover = await self._recover(blocking, models), False
                else:
                    claimed = await self._store.claim(
                        blocking, models, self.name, free, _CLAIM_BLOCK_MS
                    )
                backoff.reset()
            except Exception as exc:  # a bug must not stop the worker and strand its jobs
                lane.recover = True  # the reply may have been lost with the connection
                await self._claim_failed(lane, exc, backoff)
                continue
            finally:
                self._reserved -= free
            for entry in claimed:
                self._spawn(entry, self._run_claimed(runner, entry))
            if len(claimed) < free:
                self._slot_freed.set()  # places left unused: another lane may take them

    async def _claim_failed(self, lane: _Lane, exc: Exception, backoff: Backoff) -> None:
        """Log a failed claim read and wait ``backoff`` before the next; after Redis lost
        its data the ready groups are made again."""
        if not isinstance(exc, RedisError):
            log.error("claiming jobs failed; retrying in %.2fs", backoff.delay_s, exc_info=exc)
            await backoff.wait()
            return
        log.warning("claiming jobs failed (%s); retrying in %.2fs", exc, backoff.delay_s)
        await lane.reset()
        await backoff.wait()
        if "NOGROUP" in str(exc):
            with contextlib.suppress(RedisError):
                await self._store.ensure_groups(lane.models)

    async def _recover(self, blocking: Redis, models: list[str]) -> list[Claimed]:
        """The entries Redis delivered to this worker that it never saw: a claim whose
        reply was lost when its connection broke. Found in the worker's own pending list,
        they run now rather than a whole lease later, when another worker would take them."""
        # The pending list holds the jobs running here and one lost claim's: each at most
        # ``concurrency`` entries per model, so twice that reads it whole.
        held = await self._store.claim(
            blocking, models, self.name, 2 * self._concurrency, 0, history=True
        )
        lost = [job for job in held if job.job_id not in self._running]
        if lost:
            log.warning("claimed %d job(s) whose claim reply was lost; running them", len(lost))
        return lost

    def _spawn(self, job: Claimed, work: Coroutine[Any, Any, None]) -> None:
        job_id = job.job_id
        earlier = self._running.get(job_id)
        if earlier is not None:
            # The job was taken back out of the engine (park.lua) and dispatched here again
            # before this worker read the notice that drops its earlier attempt: that
            # attempt is stale. It is dropped, and the new one starts once it has ended, so
            # that the two never share the job's buffers, entry numbers or flags.
            log.info("job %s: a new attempt replaces the one running here", job_id)
            self._drop(job_id)
            work = self._after(earlier, job_id, work)
        task = asyncio.create_task(work)
        self._running[job_id] = task
        self._jobs[job_id] = job
        task.add_done_callback(lambda _t: self._release(job_id, task))

    async def _after(
        self, earlier: asyncio.Task[None], job_id: str, work: Coroutine[Any, Any, None]
    ) -> None:
        """Run ``work`` once the dropped ``earlier`` attempt of the same job has ended."""
        try:
            await asyncio.wait([earlier])  # its outcome is its own (cancelled, as a rule)
        except BaseException:
            work.close()  # never started: nothing to undo
            raise
        # The earlier attempt's marks and whatever it left buffered (an end it was writing
        # when dropped: complete.lua would refuse it) are not this attempt's.
        self._dropped.discard(job_id)
        self._finishing.discard(job_id)
        self._writer.discard(job_id)
        await work

    def _release(self, job_id: str, task: asyncio.Task[None]) -> None:
        if self._running.get(job_id) is not task:
            return  # an earlier attempt that a new one replaced: the new one holds the job
        self._running.pop(job_id, None)
        self._jobs.pop(job_id, None)
        self._dropped.discard(job_id)
        self._finishing.discard(job_id)
        self._slot_freed.set()

    def _take_over(self, runner: JobRunner, taken: Reclaimed) -> None:
        """Run, or end, a job taken over from a dead worker (see ``reclaim.lua``)."""
        telemetry.RECLAIMS.labels(taken.decision.value).inc()
        job = taken.job
        if job.job_id in self._running:  # our own, after renewals failed for a lease
            log.warning("job %s: reclaimed its own entry; it runs already", job.job_id)
            return
        log.warning("job %s: taken over from a dead worker (%s)", job.job_id, taken.decision)
        if taken.decision is Reclaim.RETRY:
            self._spawn(job, self._retry(runner, job, taken.attempts))
        else:
            self._spawn(job, self._end_reclaimed(job, taken))

    async def _retry(self, runner: JobRunner, job: Claimed, attempts: int) -> None:
        await asyncio.sleep(backoff_s(self._settings, max(attempts, 1)))
        await self._run_claimed(runner, job)

    async def _end_reclaimed(self, job: Claimed, taken: Reclaimed) -> None:
        if taken.decision is Reclaim.DEAD:
            telemetry.DEAD_LETTERS.inc()
            outcome = Outcome(JobState.FAILED, error=_dead_letter(taken.attempts), dead_letter=True)
        else:
            outcome = Outcome(JobState.FAILED, error=_WORKER_LOST)
        self._finishing.add(job.job_id)
        await self._writer.finish(job, outcome)

    async def _run_claimed(self, runner: JobRunner, job: Claimed) -> None:
        # The engine call starts at once; start.lua runs alongside it (one round trip
        # less before the first token) and may tell us the job ended meanwhile. It waits
        # until the engine has the request (briefly at most), so that its round trip does
        # not delay the request's own write on this busy event loop. When the engine
        # accepted a streamed request, start.lua also marks that in its result stream, so
        # its client's response headers go out then and not with the first token.
        sent: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def mark_sent(accepted: bool) -> None:
            if not sent.done():
                sent.set_result(accepted)

        run = asyncio.ensure_future(runner.run(job, mark_sent))
        run.add_done_callback(lambda _: mark_sent(False))
        try:
            accepted = False
            with contextlib.suppress(TimeoutError):  # not wait_for: ``broker.process.tasks``
                async with asyncio.timeout(_START_AFTER_SENT_S):
                    accepted = await sent
            attempt = await self._start(job, accepted)
        except BaseException:  # the job was cancelled meanwhile (or the worker stops)
            run.cancel()  # either way the entry stays pending or is acked: nothing is lost
            self._writer.discard(job.job_id)
            raise
        if attempt is None:  # cancelled while it waited in the ready stream
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            self._writer.discard(job.job_id)
            return
        outcome = await self._outcome(job, run)
        if isinstance(outcome, HandBack):
            handed = await self._hand_back(job, outcome.cause)
            if handed is None:
                return
            outcome = handed
        self._finishing.add(job.job_id)
        if await self._writer.finish(job, outcome):
            self.telemetry.ended(job, outcome)
            _log_server_failure(job.job_id, outcome)

    async def _outcome(
        self, job: Claimed, run: asyncio.Future[Outcome | HandBack]
    ) -> Outcome | HandBack:
        """The runner's outcome; a failed one when the worker stops or the runner broke."""
        try:
            return await run
        except asyncio.CancelledError:
            if job.job_id in self._dropped:  # ended by cancel.lua, or another worker's now
                self._writer.discard(job.job_id)
                raise
            return Outcome(JobState.FAILED, error=_SHUTDOWN_ERROR)
        except Exception as exc:  # a bug must not leave the job running forever
            log.exception("job %s crashed the runner", job.job_id)
            return Outcome(JobState.FAILED, error=_internal_error(exc))

    async def _hand_back(self, job: Claimed, cause: EngineError) -> Outcome | None:
        """Queue the job again for another endpoint: its engine never took it
        (``reroute.lua``). None when it went back, or is not this attempt's any more; the
        failed outcome when it may not go back (handed back the most times allowed, or
        output was written after all)."""
        self._writer.discard(job.job_id)  # a started mark still buffered: this attempt's
        backoff = Backoff()
        while True:  # as ``_start``: a retry after a lost reply finds it gone ('stale')
            try:
                handed = await self._store.reroute(job)
                break
            except RedisError as exc:
                log.warning("handing back job %s failed (%s); retrying", job.job_id, exc)
                await backoff.wait()
        if handed.outcome is Reroute.REROUTED:
            log.info(
                "job %s: the engine at %s did not take it (%s); handed back for another "
                "endpoint (%d time(s))", job.job_id, job.endpoint, cause.code, handed.times,
            )  # fmt: skip
            telemetry.REROUTES.labels("rerouted").inc()
            return None
        if handed.outcome is Reroute.EXHAUSTED:
            telemetry.REROUTES.labels("exhausted").inc()
            error = no_engine_took(cause, job.endpoint, handed.times)
            return Outcome(JobState.FAILED, error=error.to_error())
        if handed.outcome is Reroute.OUTPUT:
            return Outcome(JobState.FAILED, error=cause.to_error())
        return None  # ended, taken back, or another worker's: nothing more to write

    async def _start(self, job: Claimed, accepted: bool) -> int | None:
        """start.lua, retried while Redis is unreachable (a restart): a job given up here
        would stay ``dispatched`` with its entry pending and nobody running it. A retry
        after a lost reply is safe: start.lua answers its own worker as it did before."""
        backoff = Backoff()
        while True:
            try:
                return await self._store.start(job, self.name, accepted=accepted)
            except RedisError as exc:
                log.warning(
                    "starting job %s failed (%s); retrying in %.2fs",
                    job.job_id,
                    exc,
                    backoff.delay_s,
                )
                await backoff.wait()

    async def _cancel_job(self, notice: str) -> None:
        """A notice on the cancel channel: ``<job id>`` (the job ended: drop it) or
        ``<job id> <ready entry id>`` (park.lua took that attempt back: drop it only if it
        is the one running here, not a later attempt already dispatched here again)."""
        job_id, _, entry = notice.partition(" ")
        job = self._jobs.get(job_id)
        if entry and (job is None or job.entry_id.decode() != entry):
            return
        self._drop(job_id)

    def _lose(self, job_id: str) -> None:
        """The lease on the job's entry is gone: drop the job, unless it is ending (then
        its entry was acknowledged just before the renewal, and complete.lua checks)."""
        # A renewal answered after the job ended and left (its entry was acknowledged
        # meanwhile) is no loss: only a job still running here is dropped.
        if job_id in self._running and job_id not in self._finishing:
            log.warning("job %s: this worker lost its lease; dropping it", job_id)
            self._drop(job_id)

    def _drop(self, job_id: str) -> None:
        """Stop the job and write nothing more for it (it ended, or is not ours now)."""
        task = self._running.get(job_id)
        if task is not None:
            self._dropped.add(job_id)
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


@dataclass
class _Lane:
    """Models one blocking XREADGROUP may name, and where that read goes: the worker's
    own connection (a single Redis) or the master serving their slot (a cluster)."""

    models: list[str]
    share: int  # most places the lane may claim at once
    blocking: Redis | None = None
    connections: SlotConnections | None = None
    recover: bool = False  # a read failed: look for entries delivered but never seen

    async def connection(self) -> Redis:
        if self.blocking is not None:
            return self.blocking
        assert self.connections is not None
        return await self.connections.get(self.models)

    async def reset(self) -> None:
        if self.connections is not None:
            await self.connections.reset(self.models)


_SHUTDOWN_ERROR: dict[str, object] = {
    "message": "the worker shut down before the job finished; please retry",
    "type": "server_error",
    "code": "worker_shutdown",
    "status": 503,
}


_WORKER_LOST: dict[str, object] = {
    "message": "the worker running the request stopped after part of the answer was sent; "
    "it is not retried, so that no text is repeated: please send the request again",
    "type": "server_error",
    "code": "worker_lost",
    "status": 502,
}


def _dead_letter(attempts: int) -> dict[str, object]:
    return {
        "message": f"the request was started {attempts} times and each time its worker "
        "stopped before any answer: it is held back as a dead letter (see "
        "GET /v1/admin/dead-letters); check its input before sending it again",
        "type": "server_error",
        "code": "dead_letter",
        "status": 500,
    }


def _internal_error(exc: Exception) -> dict[str, object]:
    return {
        "message": f"the worker failed while running the job: {type(exc).__name__}",
        "type": "server_error",
        "code": "worker_error",
        "status": 500,
    }


def _log_server_failure(job_id: str, outcome: Outcome) -> None:
    """A job failed in the engine or the worker (5xx): its detail (the engine's URL, the
    socket's error) is logged here, once, under the job id its client is told
    (``broker.failure_text``), rather than on every read of the job."""
    error = outcome.error or {}
    if outcome.state is JobState.FAILED and (status := failed_status(error)) >= 500:
        log.warning("job %s failed (%s, %d): %s", job_id, error.get("code"), status,
                    error.get("message"))  # fmt: skip
