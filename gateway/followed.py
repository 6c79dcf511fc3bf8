"""A job this gateway submitted (or resumed) and follows until it ends or its client leaves.

The result stream is followed *before* the job is queued, so no event can be
written before this process reads from the stream's start. The job belongs to
the connections that follow it: if the client leaves before the job's end
event was read, ``release`` cancels the job (cancel.lua tells the worker to
abort the engine request). A job whose end event was read is never cancelled.

A streaming client that leaves after output began may come back with
``Last-Event-ID`` (``resume``), on this gateway or another: its job is then
cancelled only if no newer connection took it over within
``stream_resume_grace_s``. Each connection takes a generation number from the
job's hash (``HINCRBY cx``, the original is 0); the one that leaves cancels
only while its generation is still the newest. The check and the cancel are
two calls: a resume in the few microseconds between them finds its job
cancelled, and its client sees that as the end event.

A request with an ``Idempotency-Key`` (``submit_once``) is followed the same way,
whether it made its job or found the one an earlier try made (``replayed``: followed
from the start of its results, or from its ``Last-Event-ID``). Its client may send it
again, so it is ``retriable`` from the start: leaving before the end, it cancels its
job only after the grace, and only if no newer connection (a retry took a generation)
follows the job. A gateway that dies cancels nothing: the retry finds the job as it is.

A job of a key with a quota carries the quota's ``x-ratelimit-*`` headers as queueing it
left them (``gateway.ratelimit``), for whichever answer its request gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from broker import idempotency, job_fields, keys
from broker.errors import FairqError, InvalidRequest, NotFound
from broker.jobs import JobRecord, RequestKind, Submission
from broker.process.mailbox import Mailbox
from broker.results import ResultEvent, read_after
from gateway.errors import JOB_HEADER, REPLAYED_HEADER
from gateway.outcomes import SHUTDOWN
from gateway.ratelimit import ratelimit_headers
from gateway.state import Gateway

log = logging.getLogger(__name__)

_GENERATION = job_fields.FOLLOWER  # the newest connection following the job


class FollowedJob:
    """One request's job: its events' mailbox, and the cleanup that must run exactly once."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        model: str,
        owner: str,
        job_id: str,
        events: Mailbox[ResultEvent],
        stack: contextlib.AsyncExitStack,
    ) -> None:
        self.gateway = gateway
        self.model = model
        self.owner = owner
        self.id = job_id
        self.events = events
        self.ended = False  # set once the end event was read: nothing left to cancel
        self.delivered = False  # output went to the client: it may resume, so wait first
        self.retriable = False  # sent with an Idempotency-Key: it may come again, so wait
        self.replayed = False  # the job an earlier try with its Idempotency-Key made
        self.generation = 0
        self.resume_entry = b""  # resuming: the entry the client saw part of
        self.skip = 0  # ... and how many of its events it saw
        self.quota_headers: dict[str, str] = {}  # its key's quotas' x-ratelimit-*
        # A Responses stream: named events, no [DONE], its error an ``error`` event (``sse``).
        self.named_events = False
        self._stack = stack

    @classmethod
    async def submit(cls, gateway: Gateway, sub: Submission) -> FollowedJob:
        """Follow the job's results, then queue it (QueueFull etc. propagate)."""
        assert sub.job_id is not None, "the payload embeds the id: generate it first"
        stack = contextlib.AsyncExitStack()
        events = await stack.enter_async_context(gateway.reader.follow(sub.model, sub.job_id))
        gateway.track(sub.job_id, events)
        stack.callback(gateway.untrack, sub.job_id)
        try:
            submitted = await gateway.queue.submit_job(sub)
        except BaseException:
            await stack.aclose()
            raise
        followed = cls(
            gateway, model=sub.model, owner=sub.owner, job_id=sub.job_id, events=events, stack=stack
        )
        if submitted.quota is not None:
            followed.quota_headers = ratelimit_headers(submitted.quota)
        followed.named_events = sub.kind is RequestKind.RESPONSE
        return followed

    @classmethod
    async def submit_once(
        cls, gateway: Gateway, sub: Submission, entry: bytes = b"0-0", skip: int = 0
    ) -> FollowedJob:
        """``submit`` for a request with an Idempotency-Key (``sub.once``): its new job, or
        the job an earlier try made, followed from ``entry`` and ``skip`` (``resume``)."""
        # Its first lines are submit's, not shared through a helper: every request without
        # a key runs submit, and a helper would cost each one more coroutine frame.
        assert sub.job_id is not None, "the payload embeds the id: generate it first"
        stack = contextlib.AsyncExitStack()
        events = await stack.enter_async_context(gateway.reader.follow(sub.model, sub.job_id))
        gateway.track(sub.job_id, events)
        stack.callback(gateway.untrack, sub.job_id)
        try:
            submitted = await gateway.queue.submit_once(sub)
        except BaseException:
            await stack.aclose()
            raise
        if submitted.replayed:
            await stack.aclose()  # nothing comes for the id this try would have had
            followed = await cls.replay(gateway, submitted.job_id, sub.owner, entry, skip)
        else:
            followed = cls(
                gateway,
                model=sub.model,
                owner=sub.owner,
                job_id=sub.job_id,
                events=events,
                stack=stack,
            )
            followed.retriable = True
        if submitted.quota is not None:
            followed.quota_headers = ratelimit_headers(submitted.quota)
        followed.named_events = sub.kind is RequestKind.RESPONSE
        return followed

    @classmethod
    async def replay(
        cls, gateway: Gateway, job_id: str, owner: str, entry: bytes, skip: int
    ) -> FollowedJob:
        """Follow the job an Idempotency-Key made, streamed or not, from ``entry``;
        IdempotentResultGone when it ended and expired."""
        try:
            job = await gateway.queue.get(job_id, owner)
        except NotFound:
            raise idempotency.job_gone(job_id) from None
        followed = await cls._follow(gateway, job, owner, entry, skip)
        followed.retriable = followed.replayed = True
        return followed

    @classmethod
    async def resume(
        cls, gateway: Gateway, job: JobRecord, owner: str, entry: bytes, skip: int
    ) -> FollowedJob:
        """Follow a streamed job again from a point its client reached (``sse.resume_point``).

        The events from ``entry`` on are read again; the first ``skip`` of ``entry``'s own
        are left out by ``sse``. A job that has ended is served from what Redis holds.
        """
        if not job.stream:
            raise InvalidRequest(
                f"job {job.id!r} was not streamed: read its result with GET /v1/jobs/{job.id}"
            )
        followed = await cls._follow(gateway, job, owner, entry, skip)
        followed.delivered = True  # it is a reconnection: its client may come back again
        return followed

    @classmethod
    async def _follow(
        cls, gateway: Gateway, job: JobRecord, owner: str, entry: bytes, skip: int
    ) -> FollowedJob:
        """Follow a job that exists from ``entry`` (``resume``), as its newest connection."""
        after = _before(entry) if skip else entry
        stack = contextlib.AsyncExitStack()
        events: Mailbox[ResultEvent]
        if job.state.terminal:
            events = Mailbox()
            for event in await read_after(gateway.redis, job.model, job.id, after):
                events.put_nowait(event)
        else:
            events = await stack.enter_async_context(
                gateway.reader.follow(job.model, job.id, after)
            )
        followed = cls(
            gateway, model=job.model, owner=owner, job_id=job.id, events=events, stack=stack
        )
        followed.resume_entry, followed.skip = entry, skip
        followed.named_events = job.kind is RequestKind.RESPONSE
        followed.generation = int(
            await gateway.redis.hincrby(keys.job(job.model, job.id), _GENERATION, 1)
        )
        return followed

    async def release(self) -> None:
        """Stop following; cancel the job first if its client left before it ended."""
        try:
            await self._stack.aclose()
            if not self.ended and await self._abandoned():
                await self.gateway.queue.cancel(self.id, self.owner)
        except FairqError as exc:
            log.warning("could not cancel job %s after its client left: %s", self.id, exc)

    async def _abandoned(self) -> bool:
        """True unless the client may still resume, or has (a newer connection follows)."""
        grace_s = self.gateway.settings.stream_resume_grace_s
        if not (self.delivered or self.retriable) or grace_s <= 0:
            return True
        await asyncio.sleep(grace_s)
        newest = await self.gateway.redis.hget(keys.job(self.model, self.id), _GENERATION)
        return int(newest or 0) == self.generation

    @property
    def resumed(self) -> bool:
        """Followed from past the start of its results (a ``Last-Event-ID``)."""
        return self.resume_entry not in (b"", b"0-0")

    def headers(self) -> dict[str, str]:
        """The response headers that name the job (and say it was replayed), and its
        quotas' x-ratelimit-*."""
        if self.replayed:
            return {JOB_HEADER: self.id, REPLAYED_HEADER: "true", **self.quota_headers}
        return {JOB_HEADER: self.id, **self.quota_headers}

    async def result(self) -> tuple[bytes | None, ResultEvent]:
        """The response body (if one was written) and the end event (or ``SHUTDOWN``)."""
        body = None
        while True:
            event = await self.events.get()
            if event.body is not None:
                body = event.body
            elif event.end is not None:
                self.ended = True
                return body, event
            elif event is SHUTDOWN:
                return body, event


def _before(entry: bytes) -> bytes:
    """The id just before ``entry``, so that a read *after* it includes ``entry``."""
    ms, _, seq = entry.partition(b"-")
    if int(seq or 0) > 0:
        return b"%s-%d" % (ms, int(seq) - 1)
    return b"%d-%d" % (int(ms) - 1, 2**63 - 1) if int(ms) > 0 else b"0-0"
