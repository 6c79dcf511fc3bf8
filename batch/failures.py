"""A batch step that raised: back off, then give the batch up.

A step that raises is run again by a later sweep (a line whose content makes ingest
raise fails that line alone: ``ingest``). Left at that, a step that raises every time
would run every sweep until the batch's window ends, and RQ would keep each failure for
a day. Instead the failure is counted on the batch (``step_fails`` in a row, the last
``step_error``, at most ``_ERROR_CHARS``) and the step keeps the batch's lease for
``sweep_interval_s`` x 2^(n-1) (at most ``_LONGEST_S``), so no step runs meanwhile. The
``batch.step_max_tries``-th failure in a row fails the batch with that error in
``errors``: its lines that have not started are cancelled, nothing is collected, and
its working keys are dropped. A step that goes through clears the count. The exception
is logged here and does not reach RQ.
"""

from __future__ import annotations

import logging

import orjson

from batch.context import StepContext
from batch.harvest import stop_pending
from batch.ingest import cleanup
from broker import keys
from broker.batch import batch_fields
from broker.jobs import JobState

log = logging.getLogger(__name__)

_LONGEST_S = 60
_ERROR_CHARS = 500
_ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


async def step_failed(ctx: StepContext, exc: Exception) -> bool:
    """Count the failure, then back off or give the batch up. True when the step keeps the
    lease for the back-off: the caller must not release it."""
    if not await ctx.redis.exists(keys.batch(ctx.batch_id)):
        return False  # deleted meanwhile: nothing to count on
    error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
    tries = await ctx.store.step_failed(ctx.batch_id, error)
    limit = ctx.settings.batch.step_max_tries
    if tries >= limit:
        what = "batch %s: step failed %d times in a row; the batch fails"
        log.error(what, ctx.batch_id, tries, exc_info=exc)
        await _give_up(ctx, tries, error)
        return False
    delay_s = min(ctx.settings.batch.sweep_interval_s * 2 ** (tries - 1), _LONGEST_S)
    what = "batch %s: step failed (%s); try %d of %d in %d s"
    first = exc if tries == 1 else None  # the traceback once, not at every try
    log.warning(what, ctx.batch_id, error, tries + 1, limit, delay_s, exc_info=first)
    await ctx.store.hold_lease(ctx.batch_id, ctx.token, delay_s * 1000)
    return True


async def _give_up(ctx: StepContext, tries: int, error: str) -> None:
    message = f"the batch could not go on: its step failed {tries} times in a row, last: {error}"
    data = [{"code": "batch_step_failed", "message": message, "line": None, "param": None}]
    errors = orjson.dumps({"object": "list", "data": data})
    await ctx.store.move(ctx.batch_id, "failed", _ACTIVE, batch_fields.FAILED_AT, errors=errors)
    try:
        await stop_pending(ctx, JobState.CANCELLED, collect=False)
    except Exception:  # the failing piece may be this one: the lines then run and expire
        log.exception("batch %s: its queued lines could not be cancelled", ctx.batch_id)
    await cleanup(ctx)
