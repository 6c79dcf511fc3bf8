"""Collecting the ended lines of a batch, and ending the lines a cancel or expiry stops.

``pending`` holds the queued and running lines (member ``job id\\ncustom_id``,
score = line). A pass reads the lowest pending lines' job records; for each
ended job it records the line's output or error (``batch_record.lua``: exactly
once, and counted) and only then deletes the job and its result stream. A pass
killed half-way leaves jobs that are recorded but not deleted, which the next
pass records again as a no-op and deletes.

Batch line jobs are kept ``batch.line_keep_s`` after they end (not
``result_ttl_s``), so a result waits for its pass even across a long
batch-worker outage. A job that is gone all the same is recorded as an error
(``result_lost``), never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import orjson

from batch.context import StepContext
from broker import job_fields, keys, telemetry
from broker.batch.lines import LineError, error_record, failed_body, response_record
from broker.jobs import JobState, model_of
from broker.queue import cancel_call
from broker.redis import replies
from broker.results import BODY_FIELD

_PAGE = 500
_ENDED_WITHOUT_RUNNING = {
    JobState.CANCELLED: ("batch_cancelled", "the batch was cancelled before this request ran"),
    JobState.EXPIRED: ("batch_expired", "the batch expired before this request ran"),
}


@dataclass(frozen=True, slots=True)
class PendingLine:
    member: bytes
    number: int
    job_id: str
    custom_id: str
    model: str

    @classmethod
    def parse(cls, member: bytes, score: float) -> PendingLine:
        job_id, _, custom_id = member.decode().partition("\n")
        return cls(member, int(score), job_id, custom_id, model_of(job_id) or "")


async def pending_page(ctx: StepContext, after: int, count: int) -> list[PendingLine]:
    """Up to ``count`` pending lines numbered above ``after``, lowest first."""
    rows = await ctx.redis.zrangebyscore(
        keys.batch_pending(ctx.batch_id), f"({after}", "+inf", start=0, num=count, withscores=True
    )
    return [PendingLine.parse(member, score) for member, score in replies.scored(rows)]


async def harvest(ctx: StepContext, lines: list[PendingLine]) -> int:
    """Record the ended ones of ``lines``; returns how many were recorded by this pass."""
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for line in lines:
            pipe.hmget(keys.job(line.model, line.job_id), job_fields.STATE, job_fields.ERROR)
        states = await pipe.execute()
    ended = [
        (line, st, err)
        for line, (st, err) in zip(lines, states, strict=True)
        if st is None or JobState(st.decode()).terminal
    ]
    if not ended:
        return 0
    bodies = await _bodies(ctx, [line for line, st, _ in ended if st == b"completed"])
    counters: list[Literal["completed", "failed"]] = []
    calls = []
    for line, st, err in ended:
        record = _record(ctx.batch_id, line, st, err, bodies.get(line.job_id))
        counters.append("completed" if record[:1] == b"o" else "failed")
        call = ctx.store.record_call(ctx.batch_id, line.number, counters[-1], record, line.member)
        calls.append(call)
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for call in calls:
            call.queue(pipe)
        replies = await pipe.execute()
    for (line, _, _), call, counter, reply in zip(ended, calls, counters, replies, strict=True):
        if call.decode(reply):  # a line recorded by an earlier pass is not counted again
            telemetry.batch_request_ended(line.model, counter)
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for line, _, _ in ended:
            pipe.delete(keys.job(line.model, line.job_id), keys.results(line.model, line.job_id))
        await pipe.execute()
    return len(ended)


async def _bodies(ctx: StepContext, lines: list[PendingLine]) -> dict[str, bytes]:
    """The response bodies of completed jobs (the ``b`` entry of their result streams)."""
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for line in lines:
            pipe.xrange(keys.results(line.model, line.job_id), count=4)
        replies = await pipe.execute()
    bodies: dict[str, bytes] = {}
    for line, entries in zip(lines, replies, strict=True):
        for _, fields in entries:
            if BODY_FIELD in fields:
                bodies[line.job_id] = fields[BODY_FIELD]
    return bodies


def _record(
    batch_id: str, line: PendingLine, st: bytes | None, err: bytes | None, body: bytes | None
) -> bytes:
    if st is None:
        return error_record(
            batch_id,
            LineError(
                line.number,
                line.custom_id,
                "result_lost",
                "the request's result expired before the batch collected it",
            ),
        )
    state = JobState(st.decode())
    if state is JobState.COMPLETED and body is not None:
        return response_record(
            batch_id, line.number, line.custom_id, line.job_id, status=200, body=body
        )
    if state in _ENDED_WITHOUT_RUNNING:
        code, message = _ENDED_WITHOUT_RUNNING[state]
        return error_record(batch_id, LineError(line.number, line.custom_id, code, message))
    error = orjson.loads(err) if err else None
    if state is JobState.COMPLETED:
        error = {
            "message": "the engine returned no response body",
            "type": "server_error",
            "code": "engine_error",
            "status": 502,
        }
    status, payload = failed_body(error, line.job_id)
    return response_record(
        batch_id, line.number, line.custom_id, line.job_id, status=status, body=payload
    )


async def stop_pending(ctx: StepContext, state: JobState, *, collect: bool = True) -> None:
    """End every pending line that has not started (cancelled or expired); running ones
    finish. Then collect what has ended (unless not ``collect``: a batch given up).
    Page by page, renewing the lease."""
    after = 0
    while lines := await pending_page(ctx, after, _PAGE):
        await _stop_unstarted(ctx, lines, state)
        if collect:
            await harvest(ctx, lines)
        await ctx.renew()
        after = lines[-1].number


async def _stop_unstarted(ctx: StepContext, lines: list[PendingLine], state: JobState) -> None:
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for line in lines:
            job_key = keys.job(line.model, line.job_id)
            pipe.hmget(job_key, job_fields.STATE, job_fields.USER, job_fields.BAND)
        states = await pipe.execute()
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for line, (st, user, band) in zip(lines, states, strict=True):
            if st in (b"queued", b"dispatched"):
                cancel_call(
                    line.model,
                    line.job_id,
                    band=band.decode(),
                    user=user.decode(),
                    state=state,
                    ttl_s=ctx.settings.batch.line_keep_s,
                ).queue(pipe)
        await pipe.execute()
