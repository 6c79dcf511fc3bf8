"""The producer side of the queue: submit, look up and cancel jobs.

Used by the HTTP gateway and the Python client alike; both resolve the caller
to a user first, and every lookup by id checks that the job is the caller's own
(another user's job is reported as not found, never as forbidden).
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import keys, replies, telemetry
from broker.errors import BrokerUnavailable, NotFound, QueueFull
from broker.jobs import JobRecord, JobState, RequestKind, model_of, new_job_id, owner_of
from broker.position import QueuePosition
from broker.requests import resumable
from broker.resp import RespLink
from broker.scripts import Scripts, run_script
from broker.settings import Settings


@dataclass(frozen=True)
class Submission:
    """One request to queue; ``user`` is the fairness unit, ``owner`` the key's user."""

    model: str
    owner: str
    user: str
    tenant: str
    band: str
    kind: RequestKind
    stream_flag: str  # "0" not streamed, "1" streamed, "2" streamed with usage chunk
    payload: bytes
    job_id: str | None = None
    cost: float = 0.0  # estimated service in weighted tokens (token-fair)
    weight: float = 1.0  # the key's fairness weight


_ROUTES = {1: "queued", 2: "express"}  # enqueue.lua's reply -> how the job went on


class JobQueue:
    def __init__(self, redis: Redis, settings: Settings, link: RespLink | None = None) -> None:
        """``link``: a lean connection (``broker.resp``) for ``enqueue.lua``, which every
        request runs; without it, redis-py's."""
        self._redis = redis
        self._settings = settings
        self._scripts = Scripts.bind(redis)
        self._link = link

    async def submit(self, sub: Submission) -> str:
        """Queue a job (or send it express, see ``broker.dispatching``) and return its id;
        raises QueueFull when the user's queue is full."""
        job_id = sub.job_id or new_job_id(sub.model)
        keys_ = self._enqueue_keys(sub, job_id)
        args = self._enqueue_args(sub, job_id, self._settings.max_queued_per_user)
        try:
            reply = await run_script(self._scripts.enqueue, keys_, args, self._link)
        except RedisError as exc:
            raise BrokerUnavailable(f"could not queue the request: {exc}") from exc
        if reply[0] in _ROUTES:
            telemetry.JOBS_SUBMITTED.labels(sub.model, sub.band, _ROUTES[reply[0]]).inc()
        if reply[0] == 0:
            telemetry.JOBS_REFUSED.labels(sub.model, sub.band, "queue_full").inc()
            raise QueueFull(
                f"you already have {reply[1]} queued requests for model {sub.model!r} "
                f"(the limit is {self._settings.max_queued_per_user}); "
                "retry after some of them have started",
                retry_after_s=self._settings.queue_full_retry_after_s,
            )
        return job_id

    def enqueue_call(
        self, sub: Submission, job_id: str, max_queued: int, keep_s: int | None = None
    ) -> tuple[list[str], list[str | bytes | float | int]]:
        """KEYS and ARGV of ``enqueue.lua`` for one job, for callers that pipeline many
        (the batch ingest). ``keep_s`` keeps the ended job that long, not ``result_ttl_s``.
        """
        return self._enqueue_keys(sub, job_id), self._enqueue_args(sub, job_id, max_queued, keep_s)

    @staticmethod
    def _enqueue_keys(sub: Submission, job_id: str) -> list[str]:
        m = sub.model
        return [
            keys.job(m, job_id),
            keys.queue(m, sub.band, sub.user),
            keys.backlog(m, sub.band),
            keys.meta(m),
            keys.queued_counts(m),
            keys.ready(m),
            keys.inflight(m),
            keys.unstarted(m),
            keys.user_counts(m),
            keys.transit(m),
        ]

    def _enqueue_args(
        self, sub: Submission, job_id: str, max_queued: int, keep_s: int | None = None
    ) -> list[str | bytes | float | int]:
        s = self._settings
        model = s.model(sub.model)
        engine_priority = model is not None and model.engine_priority
        engine_resumes = (
            model is not None and model.engine == "vllm" and model.resume_streams != "off"
        )
        return [
            job_id, sub.user, sub.tenant, sub.band, sub.kind.value, sub.stream_flag,
            sub.payload, max_queued, keys.wake_channel(sub.model),
            keys.join_field(sub.band), sub.owner, sub.cost, sub.weight,
            keys.tenant_field(sub.band, sub.tenant), s.ready_stream_maxlen,
            int(engine_priority), s.bands.index(sub.band) + 1, len(s.bands),
            *s.bands, *(keys.grant_field(b) for b in s.bands), keep_s or "",
            # Going on needs vLLM's return_token_ids (workers.resume_exact), or, from the
            # text, its continue_final_message (workers.resume).
            int(engine_resumes and sub.stream_flag != "0" and resumable(sub.payload)),
        ]  # fmt: skip

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
            return await QueuePosition.read(self._redis, self._scripts, job, self._settings.bands)
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
        call_keys, args = cancel_call(
            job.model, job.id, band=job.band, user=job.user, state=state,
            ttl_s=self._settings.result_ttl_s,
        )  # fmt: skip
        try:
            await self._scripts.cancel(keys=call_keys, args=args)
        except RedisError as exc:
            raise BrokerUnavailable(f"could not cancel job {job.id!r}: {exc}") from exc


def cancel_call(
    m: str, job_id: str, *, band: str, user: str, state: JobState, ttl_s: int
) -> tuple[list[str], list[str | int]]:
    """KEYS and ARGV of ``cancel.lua`` for one job (also pipelined by batch cancels)."""
    call_keys = [
        keys.job(m, job_id),
        keys.results(m, job_id),
        keys.ready(m),
        keys.inflight(m),
        keys.queue(m, band, user),
        keys.backlog(m, band),
        keys.unstarted(m),
        keys.user_counts(m),
        keys.queued_counts(m),
        keys.meta(m),
        keys.transit(m),
        keys.parked(m, band, user),
    ]
    args: list[str | int] = [
        job_id, keys.READY_GROUP, ttl_s, keys.wake_channel(m), keys.cancel_channel(m),
        user, state.value, band,
    ]  # fmt: skip
    return call_keys, args
