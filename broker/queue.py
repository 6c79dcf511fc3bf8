"""The producer side of the queue: submit, look up and cancel jobs.

Used by the HTTP gateway and the Python client alike; both resolve the caller
to a user first, and every lookup by id checks that the job is the caller's own
(another user's job is reported as not found, never as forbidden). A submission with
an Idempotency-Key (``Submission.once``) makes its job once per key: its claim first,
then enqueue.lua, which makes the job and records it in one call
(``broker.idempotency``); a retry gets the first try's job id. A job of a tenant or a user
with a quota is charged to it, or refused (OverQuota), in that same call (``broker.quotas``).
"""

from __future__ import annotations

from typing import NamedTuple

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import idempotency, keys, telemetry
from broker.errors import BrokerUnavailable, NotFound, OverQuota, QueueFull
from broker.jobs import (
    JobRecord,
    JobState,
    Submission,
    model_of,
    new_job_id,
    owner_of,
)
from broker.lua import Call
from broker.lua.cancel import cancel_call
from broker.lua.enqueue import Enqueued, Route, enqueue_call
from broker.position import QueuePosition
from broker.quotas import QuotaBook, Reading, refusal_message
from broker.redis import replies
from broker.redis.resp import RespLink
from broker.requests import resumable
from broker.settings import Settings

__all__ = ["JobQueue", "cancel_call"]  # cancel_call: for the batch worker's cancels

_ROUTES = {Route.QUEUED: "queued", Route.EXPRESS: "express"}  # telemetry's labels


class Submitted(NamedTuple):
    job_id: str
    replayed: bool = False  # the Idempotency-Key's job, made by an earlier try
    quota: Reading | None = None  # the quotas it counts against, as queueing it left them


class JobQueue:
    def __init__(self, redis: Redis, settings: Settings, link: RespLink | None = None) -> None:
        """``link``: a lean connection (``broker.redis.resp``) for ``enqueue.lua``, which every
        request runs; without it, redis-py's."""
        self._redis = redis
        self._settings = settings
        self._enqueue_over: Redis | RespLink = redis if link is None else link
        self._quotas = QuotaBook(settings.quotas)

    async def submit(self, sub: Submission) -> str:
        """Queue a job (or send it express, see ``broker.dispatching``) and return its id
        (with an Idempotency-Key, of the job the key made); raises QueueFull when the
        user's queue is full, OverQuota when a quota would be passed."""
        return (await self.submit_job(sub)).job_id

    async def submit_job(self, sub: Submission) -> Submitted:
        """``submit``, and how it left the job's quotas (the gateway's x-ratelimit-*)."""
        if sub.once is not None:
            return await self.submit_once(sub)
        job_id = sub.job_id or new_job_id(sub.model)
        call = self.enqueue_call(sub, job_id, self._settings.max_queued_per_user)
        try:  # awaited here, not in a helper: every request pays each coroutine frame
            enqueued = await call.run(self._enqueue_over)
        except RedisError as exc:
            raise BrokerUnavailable(f"could not queue the request: {exc}") from exc
        self._count(sub, enqueued)
        return Submitted(job_id, quota=enqueued.quota)

    async def submit_once(self, sub: Submission) -> Submitted:
        """``submit`` for a submission with an Idempotency-Key: the job the key made, if it
        made one for this request (``replayed``), else a new one; IdempotencyKeyReused when
        the key is another request's."""
        assert sub.once is not None, "submit_once needs the submission's Idempotency-Key"
        await idempotency.bind(self._redis, sub.once)
        job_id = sub.job_id or new_job_id(sub.model)
        call = self.enqueue_call(sub, job_id, self._settings.max_queued_per_user)
        try:
            enqueued = await call.run(self._enqueue_over)
        except RedisError as exc:
            raise BrokerUnavailable(f"could not queue the request: {exc}") from exc
        if enqueued.route is Route.REUSED:
            raise idempotency.reused(sub.once)
        if enqueued.route is Route.REPLAYED:
            return Submitted(enqueued.made, replayed=True, quota=enqueued.quota)
        self._count(sub, enqueued)
        return Submitted(job_id, quota=enqueued.quota)

    def _count(self, sub: Submission, enqueued: Enqueued) -> None:
        """Count the job in telemetry; QueueFull when the user's queue was full, OverQuota
        when a quota would have been passed."""
        if route := _ROUTES.get(enqueued.route):
            telemetry.JOBS_SUBMITTED.labels(sub.model, sub.band, route).inc()
            return
        if enqueued.route is Route.OVER_QUOTA:
            telemetry.JOBS_REFUSED.labels(sub.model, sub.band, "over_quota").inc()
            raise _over_quota(enqueued)
        if enqueued.full:
            telemetry.JOBS_REFUSED.labels(sub.model, sub.band, "queue_full").inc()
            raise QueueFull(
                f"you already have {enqueued.queued} queued requests for model {sub.model!r} "
                f"(the limit is {self._settings.max_queued_per_user}); "
                "retry after some of them have started",
                retry_after_s=self._settings.queue_full_retry_after_s,
                quota=enqueued.quota,
            )

    def enqueue_call(
        self, sub: Submission, job_id: str, max_queued: int, keep_s: int | None = None
    ) -> Call[Enqueued]:
        """``enqueue.lua``'s call for one job (the batch ingest pipelines many). ``keep_s``
        keeps the ended job that long, not ``result_ttl_s``: a batch line's, which its
        quotas never refuse and charge as it ends."""
        s, model = self._settings, self._settings.model(sub.model)
        # Going on needs vLLM's return_token_ids (workers.resume_exact), or, from the text,
        # its continue_final_message (workers.resume).
        resumes = model is not None and model.engine == "vllm" and model.resume_streams != "off"
        return enqueue_call(
            sub,
            job_id,
            max_queued=max_queued,
            bands=s.bands,
            ready_maxlen=s.ready_stream_maxlen,
            engine_priority=model is not None and model.engine_priority,
            resumable=resumes
            and sub.kind.generates
            and sub.stream_flag.to_client
            and resumable(sub.payload),
            keep_s=keep_s,
            quotas=self._quotas.of(sub.tenant, sub.owner),
            batch_line=keep_s is not None,
        )

    async def get(self, job_id: str, owner: str | None) -> JobRecord:
        """The job record; NotFound if it does not exist or belongs to someone else.

        ``owner=None`` skips the ownership check (admin and internal callers).
        """
        model = model_of(job_id)
        if model is None or self._settings.model(model) is None:
            raise NotFound(f"no job with id {job_id!r}")
        try:
            h = replies.hash_reply(await self._redis.hgetall(keys.job(model, job_id)))
        except RedisError as exc:
            raise BrokerUnavailable(f"could not read job {job_id!r}: {exc}") from exc
        if not h or (owner is not None and owner_of(h) != owner):
            raise NotFound(f"no job with id {job_id!r}")
        return JobRecord.from_hash(job_id, model, h)

    async def position(self, job: JobRecord) -> QueuePosition | None:
        """Jobs ahead of a queued job and its estimated wait; None once it left the queue."""
        if job.state is not JobState.QUEUED:
            return None
        try:
            return await QueuePosition.read(self._redis, job, self._settings.bands)
        except RedisError as exc:
            raise BrokerUnavailable(f"could not read the queue of job {job.id!r}: {exc}") from exc

    async def cancel(
        self, job_id: str, owner: str | None, state: JobState = JobState.CANCELLED
    ) -> JobRecord:
        """End the job as cancelled (or ``state``) unless it has ended; returns the record."""
        job = await self.get(job_id, owner)
        if not job.state.terminal:
            await self._end_early(job, state)
            job = await self.get(job_id, owner)
            if job.state is state:  # this call ended it (not a completion that won the race)
                telemetry.JOBS_ENDED.labels(job.model, job.band, state.value).inc()
        return job

    async def _end_early(self, job: JobRecord, state: JobState) -> None:
        call = cancel_call(
            job.model,
            job.id,
            band=job.band,
            user=job.user,
            state=state,
            ttl_s=self._settings.result_ttl_s,
        )
        try:
            await call.run(self._redis)
        except RedisError as exc:
            raise BrokerUnavailable(f"could not cancel job {job.id!r}: {exc}") from exc


def _over_quota(enqueued: Enqueued) -> OverQuota:
    reading = enqueued.quota
    assert reading is not None, "only a job with quotas is refused by one"
    refusal = reading.refusal()
    assert refusal is not None, "enqueue.lua refuses only what passes a limit"
    return OverQuota(
        refusal_message(refusal),
        unit=refusal.unit.value,
        quota=reading,
        retry_after_ms=refusal.retry_after_ms,
        never=refusal.never,
    )
