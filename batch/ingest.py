"""Validate and ingest a batch's input file: its lines become band-``batch`` jobs.

The file is read from the batch's cursor on (``off``: byte offset, ``line``:
the last line read) in chunks of ``batch.ingest_chunk_lines`` lines. Per chunk:

1. each line is checked (``lines.check_line``); a repeated ``custom_id`` is found
   with ``HSETNX custom_id -> line`` (a line that finds its own number there was
   read before, by a step that died: it is not a duplicate);
2. the valid lines are queued with ``enqueue.lua`` in one pipeline, under the
   batch cap (``batch.max_queued_lines_per_user``) instead of the interactive
   per-user cap. Job ids are derived from the batch and line, so a line queued
   before is refused by the script (``{-1}``) rather than queued twice;
3. one transaction adds the queued lines to ``pending``, records the invalid
   lines, and moves the cursor past the chunk.

A step killed anywhere in a chunk redoes that chunk and nothing twice. When the
file is read, the batch moves to ``in_progress`` (or ``failed``, when no line at
all was a valid request: the file is not a batch file).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from batch.context import StepContext
from broker import keys
from broker.batch import batch_fields
from broker.batch.lines import KINDS, LineError, ValidLine, check_line, error_record
from broker.batch.reading import Line, read_lines
from broker.batch.store import BatchRecord
from broker.errors import NotFound
from broker.jobs import Submission, new_job_id
from broker.requests import engine_payload, estimate_cost, stream_mode

_FAILED_ERRORS_SHOWN = 10
_REASON_CHARS = 300  # of an exception's text, in a line's error


def line_job_id(model: str, batch_id: str, number: int) -> str:
    return new_job_id(model, f"{batch_id.removeprefix('batch_')}-{number}")


def pending_member(job_id: str, custom_id: str) -> str:
    return f"{job_id}\n{custom_id}"


async def ingest(ctx: StepContext, batch: BatchRecord) -> None:
    """Read the rest of the file into jobs; then in_progress, or failed."""
    try:
        await ctx.files.get(batch.s(batch_fields.INPUT_FILE_ID) or "", batch.owner)
    except NotFound:
        await _fail(ctx, batch, "file_not_found", "the input file was deleted before it was read")
        return
    chunk: list[Line] = []
    lines = read_lines(
        ctx.files,
        batch.s(batch_fields.INPUT_FILE_ID) or "",
        batch.n(batch_fields.OFFSET),
        batch.n(batch_fields.LINE),
        ctx.settings.max_body_bytes,
    )
    async for line in lines:
        chunk.append(line)
        if len(chunk) >= ctx.settings.batch.ingest_chunk_lines:
            await _ingest_chunk(ctx, batch, chunk)
            chunk = []
            if not await _still_validating(ctx):
                return  # cancelled or expired meanwhile; the next step ends the batch
    if chunk:
        await _ingest_chunk(ctx, batch, chunk)
    await _finish(ctx, batch)


async def _still_validating(ctx: StepContext) -> bool:
    await ctx.renew()
    status, expiring = await ctx.redis.hmget(
        keys.batch(ctx.batch_id), batch_fields.STATUS, batch_fields.EXPIRING
    )
    return status == b"validating" and not expiring


async def _ingest_chunk(ctx: StepContext, batch: BatchRecord, chunk: list[Line]) -> None:
    checked = [_guarded(ctx, batch, line) for line in chunk]
    valid = [c for c in checked if isinstance(c, _Ready)]
    errors = [c for c in checked if isinstance(c, LineError)]
    duplicates = await _duplicates(ctx, valid)
    errors += [
        LineError(
            v.number,
            v.custom_id,
            "duplicate_custom_id",
            f"line {v.number}: custom_id {v.custom_id!r} was used before, on line "
            f"{duplicates[v.number]}; custom_ids must be unique in a batch",
        )
        for v in valid
        if v.number in duplicates
    ]
    valid = [v for v in valid if v.number not in duplicates]
    queued, full = await _enqueue(ctx, batch, valid)
    errors += [
        LineError(
            v.number,
            v.custom_id,
            "queue_full",
            f"line {v.number}: you have {ctx.settings.batch.max_queued_lines_per_user} "
            f"batch requests queued for model {v.model.name!r} already (the limit)",
        )
        for v in full
    ]
    await _commit(ctx, chunk[-1], queued, errors)


@dataclass(frozen=True)
class _Ready(ValidLine):
    """A valid line with the submission that queues it."""

    job_id: str
    submission: Submission


def _guarded(ctx: StepContext, batch: BatchRecord, line: Line) -> _Ready | LineError:
    """The line checked and its submission built, or the line's error: whatever raises on
    one line's content fails that line alone. A step that raised here would be run again
    on the same line, and the batch would never leave ``validating``."""
    checked: ValidLine | LineError | None = None
    try:
        checked = _check(ctx, batch, line)
        if isinstance(checked, LineError):
            return checked
        job_id = line_job_id(checked.model.name, ctx.batch_id, checked.number)
        submission = _submission(batch, checked, job_id)
        return _Ready(**vars(checked), job_id=job_id, submission=submission)
    except Exception as exc:  # a line's content is anything at all; its error says what
        reason = f"{type(exc).__name__}: {exc}"[:_REASON_CHARS]
        custom_id = checked.custom_id if checked is not None else None
        message = f"line {line.number} failed: {reason}"
        return LineError(line.number, custom_id, "line_failed", message)


def _check(ctx: StepContext, batch: BatchRecord, line: Line) -> ValidLine | LineError:
    if line.raw is None:
        return LineError(
            line.number,
            None,
            "line_too_long",
            f"line {line.number} is longer than {ctx.settings.max_body_bytes} bytes",
        )
    if line.number > ctx.settings.batch.max_lines:
        return LineError(
            line.number,
            None,
            "too_many_requests",
            f"line {line.number}: a batch holds at most {ctx.settings.batch.max_lines} requests",
        )
    endpoint = batch.s(batch_fields.ENDPOINT) or ""
    return check_line(line.number, line.raw, endpoint, ctx.settings, batch.models)


async def _duplicates(ctx: StepContext, valid: Sequence[ValidLine]) -> dict[int, int]:
    """Line -> the earlier line that holds its custom_id, for repeated custom_ids."""
    if not valid:
        return {}
    cids = keys.batch_custom_ids(ctx.batch_id)
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for v in valid:
            pipe.hsetnx(cids, v.custom_id, v.number)
            pipe.hget(cids, v.custom_id)
        replies = await pipe.execute()
    owners = [int(replies[2 * i + 1]) for i in range(len(valid))]
    return {v.number: owner for v, owner in zip(valid, owners, strict=True) if owner != v.number}


def _submission(batch: BatchRecord, line: ValidLine, job_id: str) -> Submission:
    return Submission(
        model=line.model.name,
        owner=batch.owner,
        user=batch.owner,
        tenant=batch.s(batch_fields.TENANT) or batch.owner,
        band="batch",
        kind=KINDS[batch.s(batch_fields.ENDPOINT) or ""],
        stream_flag=stream_mode(line.body, line.model),
        payload=engine_payload(line.body, job_id, line.model),
        job_id=job_id,
        cost=estimate_cost(line.body, line.model),
        weight=float(batch.s(batch_fields.WEIGHT) or 1.0),
    )


async def _enqueue(
    ctx: StepContext, batch: BatchRecord, valid: list[_Ready]
) -> tuple[list[tuple[ValidLine, str]], list[ValidLine]]:
    """Queue the lines: (queued or queued before, with job ids), (refused: cap reached)."""
    if not valid:
        return [], []
    settings = ctx.settings.batch
    calls = [
        ctx.queue.enqueue_call(
            line.submission, line.job_id, settings.max_queued_lines_per_user, settings.line_keep_s
        )
        for line in valid
    ]
    async with ctx.redis.pipeline(transaction=False) as pipe:
        for call in calls:
            call.queue(pipe)
        replies = [c.decode(r) for c, r in zip(calls, await pipe.execute(), strict=True)]
    queued: list[tuple[ValidLine, str]] = [
        (v, v.job_id) for v, r in zip(valid, replies, strict=True) if not r.full
    ]
    full: list[ValidLine] = [v for v, r in zip(valid, replies, strict=True) if r.full]
    return queued, full


async def _commit(
    ctx: StepContext, last: Line, queued: list[tuple[ValidLine, str]], errors: list[LineError]
) -> None:
    b = ctx.batch_id
    async with ctx.redis.pipeline(transaction=True) as pipe:
        if queued:
            members = {pending_member(job_id, v.custom_id): v.number for v, job_id in queued}
            pipe.zadd(keys.batch_pending(b), members)
            pipe.hsetnx(keys.batch(b), batch_fields.MODEL, queued[0][0].model.name)
        for error in errors:
            ctx.store.record_call(b, error.number, "failed", error_record(b, error), "").queue(pipe)
        pipe.hset(
            keys.batch(b), mapping={batch_fields.OFFSET: last.end, batch_fields.LINE: last.number}
        )
        pipe.hincrby(keys.batch(b), batch_fields.QUEUED, len(queued))
        await pipe.execute()


async def _finish(ctx: StepContext, batch: BatchRecord) -> None:
    b = ctx.batch_id
    lines, queued = await ctx.redis.hmget(keys.batch(b), batch_fields.LINE, batch_fields.QUEUED)
    total = await ctx.redis.hlen(keys.batch_results(b)) + int(queued or 0)
    if not int(queued or 0):
        await _fail(
            ctx,
            batch,
            "invalid_file",
            "the file holds no valid request: it must be JSONL, one batch request "
            "({custom_id, method, url, body}) per line",
            int(lines or 0),
        )
        return
    await ctx.store.move(
        b, "in_progress", ("validating",), batch_fields.IN_PROGRESS_AT, total=total
    )
    await ctx.redis.delete(keys.batch_custom_ids(b))


async def _fail(
    ctx: StepContext, batch: BatchRecord, code: str, message: str, lines: int = 0
) -> None:
    """Fail the batch; its first line errors, if any, are shown in ``errors``."""
    shown = (
        await ctx.redis.hmget(
            keys.batch_results(ctx.batch_id), list(range(1, lines + 1))[: _FAILED_ERRORS_SHOWN * 10]
        )
        if lines
        else []
    )
    data = [{"code": code, "message": message, "line": None, "param": None}]
    for record in [r for r in shown if r][:_FAILED_ERRORS_SHOWN]:
        error = orjson.loads(record[1:])["error"]
        data.append({**error, "param": None})
    errors = orjson.dumps({"object": "list", "data": data})
    await ctx.store.move(
        ctx.batch_id,
        "failed",
        ("validating",),
        batch_fields.FAILED_AT,
        errors=errors,
        total=0,
        completed=0,
        failed=0,
    )
    await cleanup(ctx)


async def cleanup(ctx: StepContext) -> None:
    """Drop the working keys of an ended batch and take it off the active set."""
    b = ctx.batch_id
    await ctx.redis.delete(keys.batch_results(b), keys.batch_pending(b), keys.batch_custom_ids(b))
    await ctx.redis.srem(keys.ACTIVE_BATCHES, b)
