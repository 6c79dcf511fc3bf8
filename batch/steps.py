"""One step of a batch: look at its status and do the next piece of work.

    validating              ingest (the whole file, chunk by chunk)
    in_progress/finalizing  collect the ended lines among the lowest pending ones;
                            nothing pending: finalize -> completed
    cancelling              cancel the lines that have not started, collect; nothing
                            pending: finalize -> cancelled
    past its window         (flag ``expiring``, set by the RQ-scheduled expire job, or
                            the clock) the same with the state expired -> expired
    ended                   drop the working keys (a finalize killed after the move)

A step does a bounded piece of work and returns; the batch worker's sweep runs
the next one. Lines still running when a batch is cancelled or expires finish,
and the batch ends once they have.
"""

from __future__ import annotations

import time

from batch.context import StepContext
from batch.finalize import finalize
from batch.harvest import harvest, pending_page, stop_pending
from batch.ingest import cleanup, ingest
from broker import keys
from broker.batch import batch_fields
from broker.batch.store import TERMINAL, BatchRecord
from broker.jobs import JobState


async def advance(ctx: StepContext) -> None:
    batch = await ctx.store.get(ctx.batch_id, None)
    if batch.status in TERMINAL:
        await cleanup(ctx)
        return
    expiring = bool(batch.s(batch_fields.EXPIRING)) or time.time() >= batch.n(
        batch_fields.EXPIRES_AT
    )
    if expiring:
        await _end(ctx, batch, JobState.EXPIRED)
    elif batch.status == "validating":
        await ingest(ctx, batch)
    elif batch.status == "cancelling":
        await _end(ctx, batch, JobState.CANCELLED)
    else:
        lines = await pending_page(ctx, 0, ctx.settings.batch.harvest_window)
        await harvest(ctx, lines)
        await _finalize_if_done(ctx, batch, "completed")


async def _end(ctx: StepContext, batch: BatchRecord, state: JobState) -> None:
    """Stop the lines that have not started; finalize once none is pending."""
    if not batch.s(batch_fields.TOTAL):  # the file was not read to its end: count what was
        total = await ctx.redis.hlen(keys.batch_results(ctx.batch_id)) + batch.n(
            batch_fields.QUEUED
        )
        await ctx.redis.hset(keys.batch(ctx.batch_id), batch_fields.TOTAL, total)
    await stop_pending(ctx, state)
    await _finalize_if_done(ctx, batch, state.value)


async def _finalize_if_done(ctx: StepContext, batch: BatchRecord, end: str) -> None:
    if await ctx.redis.zcard(keys.batch_pending(ctx.batch_id)) == 0:
        await finalize(ctx, batch, end)
