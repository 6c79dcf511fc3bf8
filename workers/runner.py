"""Running one job: call the engine, stream its output into Redis, decide the outcome.

The runner owns a job from its ready entry to its ``Outcome``; the writer then
records the outcome after the job's last chunk. Cancellation arrives as
``asyncio.CancelledError`` (the service cancels the task): the ``async with``
around the engine request closes the connection, which aborts the request at
the engine.

An engine call that fails in a way another call may fix (``EngineError.retryable``:
5xx, no connection, silence, a cut stream) is made again, up to
``engine_max_tries`` calls with exponential backoff, but only while none of the
job's output was handed to the writer: after that a second call would send the
client text it has already seen, so the job ends failed with the engine's reason.

When every call failed before the engine took the request (``EngineError.unaccepted``:
no connection, the connection lost before the engine answered, a 503: a replica that
is going away) and the job has no output at all, it is not failed but handed back
(``HandBack``): the service queues it again at the head of its user's line
(``reroute.lua``) and the dispatcher sends it to an endpoint that is there, at most
``engine_max_reroutes`` times per job. The tries in place come first: they give the
dispatcher's scrapes time to see a vanished replica fail, so that the job is not sent
back to it.

A job taken back out of the engine mid-answer (``park.lua``) runs again from where its
client is (``workers.attempt``): each attempt's request and the shaping of its events
on their way to the writer (token ids taken out and recorded, chunks converted). Last,
everything written says the job's service tier (``workers.service_tier``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker import (
    Claimed,
    JobState,
    Outcome,
    RequestKind,
    Settings,
    StreamMode,
    WrittenEntry,
    telemetry,
)
from workers import attempt
from workers.attempt import Attempt, Whole
from workers.engine import Accounting, accounting_for, complete, engine_headers, stream_events
from workers.engine_http import EngineClient
from workers.engine_info import ContextLengths
from workers.errors import EngineError
from workers.resume import Earlier
from workers.resume_exact import needs_context_len, seam_of
from workers.service_tier import TierStamps
from workers.whole import WholeAnswer
from workers.writer import ResultWriter

# The chunk entries earlier attempts of a resumed job wrote (``ExecutionStore.written``).
Written = Callable[[Claimed], Awaitable[list[WrittenEntry]]]

log = logging.getLogger(__name__)


def with_priority(payload: bytes, priority: int | None) -> bytes:
    """The payload with vLLM's ``priority`` field, spliced in as bytes (no JSON rebuild).

    The gateway serialised the payload as a JSON object without ``priority`` (it strips
    any the client sent), so prepending the member keeps it valid JSON.
    """
    if priority is None:
        return payload
    member = b'"priority":%d' % priority
    return b"{" + member + (b"," if payload.strip() != b"{}" else b"") + payload.lstrip()[1:]


def backoff_s(settings: Settings, attempt: int) -> float:
    """The pause before attempt ``attempt + 1`` (exponential, capped at 30 s)."""
    return float(min(settings.retry_backoff_ms * 2 ** (attempt - 1), 30_000.0) / 1000)


@dataclass(frozen=True)
class HandBack:
    """Every call failed before the engine took the request, and nothing of the job was
    written: hand it back for another endpoint (``ExecutionStore.reroute``)."""

    cause: EngineError


@dataclass
class _Progress:
    first_ms: int | None = None  # set when the first output went to the writer
    on_sent: Callable[[bool], None] | None = None  # see ``JobRunner.run``

    def sent_plain(self) -> None:
        if self.on_sent is not None:
            self.on_sent(False)

    @property
    def wrote(self) -> bool:
        return self.first_ms is not None


class JobRunner:
    def __init__(
        self,
        writer: ResultWriter,
        http: EngineClient,
        settings: Settings,
        written: Written | None = None,
    ) -> None:
        self._writer = writer
        self._http = http
        self._settings = settings
        self._written = written  # None: a resumed job starts again from scratch
        self._contexts = ContextLengths(engine_headers(settings))
        self._stamps = TierStamps(settings)
        self.retries = 0  # engine calls made again

    async def run(
        self, job: Claimed, on_sent: Callable[[bool], None] | None = None
    ) -> Outcome | HandBack:
        """Execute the job at its endpoint; engine failures become a failed outcome, or a
        hand-back when the engine never took the job (see the module's docstring).

        ``on_sent`` is called when the engine has the request: a streamed request's
        response headers arrived (with True when the engine accepted it: its client's
        headers may go out), or a non-streamed request is about to be sent (False).
        """
        progress = _Progress(on_sent=on_sent)
        plan = await self._attempt(job)
        if isinstance(plan, Whole):  # the answer had ended, or reached its limit, already
            if plan.usage is not None:
                self._writer.chunk(job, self._stamps.of(job.band).events(plan.usage))
            return _already_whole(plan.earlier)
        payload = with_priority(plan.payload, job.engine_priority)
        tries = self._settings.engine_max_tries
        for call in range(1, tries + 1):
            accounting = accounting_for(job.kind, plan.earlier)
            try:
                await self._call(job, plan, payload, accounting, progress)
            except EngineError as exc:
                if progress.wrote or not exc.retryable or call == tries:
                    if call == tries and self._may_hand_back(exc, plan, progress):
                        return HandBack(exc)
                    return Outcome(JobState.FAILED, error=exc.to_error())
                log.info("job %s: %s; calling the engine again", job.job_id, exc.code)
                self.retries += 1
                telemetry.ENGINE_RETRIES.inc()
                await asyncio.sleep(backoff_s(self._settings, call))
                continue
            return Outcome(
                JobState.COMPLETED,
                usage=accounting.usage,
                finish_reason=accounting.finish_reason,
                first_token_ms=progress.first_ms,
            )
        raise AssertionError("unreachable: the last try returns")

    def _may_hand_back(self, exc: EngineError, plan: Attempt, progress: _Progress) -> bool:
        """The engine never took the job and it has no output at all (an answer that went
        on from earlier output, ``plan.earlier``, keeps the rules in place)."""
        if self._settings.engine_max_reroutes == 0:
            return False
        return exc.unaccepted and not progress.wrote and plan.earlier is None

    async def _attempt(self, job: Claimed) -> Attempt | Whole:
        """This attempt's engine request: fresh, or going on with a resumed answer."""
        if job.resume_gen is None or self._written is None:
            return attempt.fresh(job)
        written = await self._written(job)
        seam = seam_of(job.kind, written)
        context = None
        if seam is not None and needs_context_len(job.kind, job.payload):
            context = await self._contexts.get(job.endpoint, job.model)
        plan = attempt.resumed(job, written, seam, context)
        if isinstance(plan, Attempt) and plan.earlier is not None:  # not started afresh
            telemetry.RESUMES.labels("exact" if plan.exact else "text").inc()
            if not plan.exact:
                log.info("job %s: goes on from its text (no exact token ids)", job.job_id)
        return plan

    async def _call(
        self, job: Claimed, plan: Attempt, payload: bytes, accounting: Accounting,
        progress: _Progress,
    ) -> None:  # fmt: skip
        if job.stream:
            await self._stream(job, plan, payload, accounting, progress)
        elif job.stream_flag is StreamMode.WHOLE:
            await self._whole(job, plan.url, payload, accounting, progress)
        else:
            await self._plain(job, plan.url, payload, accounting, progress)

    async def _stream(
        self, job: Claimed, plan: Attempt, payload: bytes, accounting: Accounting,
        progress: _Progress,
    ) -> None:  # fmt: skip
        shape, stamp = plan.shape, self._stamps.of(job.band)
        stamped = stamp.response_events if job.kind is RequestKind.RESPONSE else stamp.events

        def on_events(events: bytes) -> None:  # runs inside the HTTP client's callback
            trail = None
            if shape is not None:
                events, trail = shape(events)
                if not events:
                    return
            events = stamped(events)
            if progress.first_ms is None:
                progress.first_ms = int(time.time() * 1000)
                self._writer.chunk(job, events, first_ms=progress.first_ms, trail=trail)
            else:
                self._writer.chunk(job, events, trail=trail)

        await stream_events(
            self._http,
            plan.url,
            payload,
            accounting,
            on_events,
            keep_usage=job.stream_flag is StreamMode.WITH_USAGE,
            idle_timeout_s=self._settings.engine_stream_idle_timeout_s,
            on_response=progress.on_sent,
        )

    async def _whole(
        self, job: Claimed, url: str, payload: bytes, accounting: Accounting, progress: _Progress
    ) -> None:
        """Streamed from the engine, the whole answer written at its end: its first token
        marks the job started at once (``first.lua``), as a streamed job's first output."""
        answer = WholeAnswer(job.kind)
        # Not ``progress.first_ms``: that says output reached the client, after which the
        # engine is never called again; here nothing reaches it before the end.
        first_ms: int | None = None

        def on_events(events: bytes) -> None:  # runs inside the HTTP client's callback
            nonlocal first_ms
            if first_ms is None:
                first_ms = int(time.time() * 1000)
                self._writer.mark_started(job, first_ms)
            answer.add(events)

        await stream_events(
            self._http,
            url,
            payload,
            accounting,
            on_events,
            keep_usage=True,  # the usage chunk may carry the fingerprint of the body
            idle_timeout_s=self._settings.engine_stream_idle_timeout_s,
            on_response=lambda _accepted: progress.sent_plain(),  # its client waits for a body
        )
        progress.first_ms = first_ms or int(time.time() * 1000)
        self._writer.body(job, answer.body(accounting.usage, self._stamps.of(job.band).tier))

    async def _plain(
        self, job: Claimed, url: str, payload: bytes, accounting: Accounting, progress: _Progress
    ) -> None:
        self._writer.mark_started(job)  # written with the next flush, once the request is out
        body = await complete(
            self._http,
            url,
            payload,
            accounting,
            idle_timeout_s=self._settings.engine_read_timeout_s,
            on_sent=progress.sent_plain,
        )
        progress.first_ms = int(time.time() * 1000)
        self._writer.body(job, self._stamps.of(job.band).body(body))


def _already_whole(earlier: Earlier) -> Outcome:
    """A resumed job whose earlier attempt had sent the whole answer: it ends as it was."""
    return Outcome(
        JobState.COMPLETED,
        usage={"completion_tokens": earlier.tokens},
        finish_reason=earlier.finish_reason or "length",
    )
