"""Finalize a batch: write its output and error files, then move it to its end status.

Each file is written from the batch's ``res`` hash (read in line order, a page of
lines at a time) under a temporary key and renamed into place, with an id derived
from the batch: a finalize killed half-way and run again writes the same files
again, whole. The files count against the owner's file quota but are never refused
for it (a batch's results are not lost for want of space); they expire after
``batch.output_file_keep_s``. Only after the batch has its end status are its working keys
deleted, so a rerun always finds what it needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from batch.context import StepContext
from batch.ingest import cleanup
from broker import keys
from broker.batch import batch_fields
from broker.batch.lines import ERROR, OUTPUT
from broker.batch.store import BatchRecord
from broker.redis import replies

_PAGE = 1000
_STAMPS = {
    "completed": batch_fields.COMPLETED_AT,
    "cancelled": batch_fields.CANCELLED_AT,
    "expired": batch_fields.EXPIRED_AT,
}
_FROM = ("validating", "in_progress", "finalizing", "cancelling")  # the first: expiry


def output_file_ids(batch_id: str) -> tuple[str, str]:
    hex_id = batch_id.removeprefix("batch_")
    return f"file-{hex_id}-output", f"file-{hex_id}-errors"


async def finalize(ctx: StepContext, batch: BatchRecord, end: str) -> None:
    """Write the files and end the batch as ``end`` (completed, cancelled or expired)."""
    if end == "completed":
        await ctx.store.move(
            ctx.batch_id, "finalizing", ("in_progress",), batch_fields.FINALIZING_AT
        )
    batch = await ctx.store.get(ctx.batch_id, None)
    output_id, error_id = output_file_ids(ctx.batch_id)
    fields: dict[str, str | int | bytes] = {}
    if batch.n(batch_fields.COMPLETED):
        await _write(ctx, batch, output_id, "output", OUTPUT)
        fields[batch_fields.OUTPUT_FILE_ID] = output_id
    if batch.n(batch_fields.FAILED):
        await _write(ctx, batch, error_id, "errors", ERROR)
        fields[batch_fields.ERROR_FILE_ID] = error_id
    await ctx.renew()
    await ctx.store.move(ctx.batch_id, end, _FROM, _STAMPS[end], **fields)
    await cleanup(ctx)


async def _write(
    ctx: StepContext, batch: BatchRecord, file_id: str, name: str, kind: bytes
) -> None:
    await ctx.files.create(
        batch.owner,
        f"{ctx.batch_id}_{name}.jsonl",
        "batch_output",
        _records(ctx, batch.n(batch_fields.LINE), kind),
        keep_s=ctx.settings.batch.output_file_keep_s,
        file_id=file_id,
    )


async def _records(ctx: StepContext, lines: int, kind: bytes) -> AsyncIterator[bytes]:
    """The records of one kind, one JSON line each, a page of lines per block."""
    results = keys.batch_results(ctx.batch_id)
    for first in range(1, lines + 1, _PAGE):
        numbers = list(range(first, min(first + _PAGE, lines + 1)))
        records = replies.values(await ctx.redis.hmget(results, numbers))
        yield b"".join(r[1:] + b"\n" for r in records if r and r[:1] == kind)
        await ctx.renew()
