"""The RQ side of batches: the jobs on queue ``fairq-batch`` and the sweep that enqueues them.

RQ jobs (sync entry points; each runs its async step in its own event loop):

    ingest(batch, token)    a validating batch: read its file into jobs
    progress(batch, token)  collect ended lines; finalize when none is pending
    cancel(batch, token)    a cancelling batch: stop its queued lines, collect, finalize
    expire(batch)           scheduled with RQ (``enqueue_at``) for the end of the window:
                            flags the batch; its next step ends it as expired

The sweep (run by every batch worker every ``batch.sweep_interval_s``) gives each
active batch whose lease is free one step (a step that raised keeps the lease while it
backs off, and gives the batch up after ``batch.step_max_tries``: ``failures``). All
three steps run the same state machine (``steps.advance``), so a step that finds the
status moved on simply does what the new status needs.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import UTC, datetime
from functools import cache
from typing import cast

from redis import Redis as SyncRedis
from rq import Queue

from batch.context import StepContext
from batch.failures import step_failed
from batch.steps import advance
from broker import keys
from broker.batch import batch_fields
from broker.batch.errors import LeaseLost
from broker.redis import replies
from broker.redis.connect import connect
from broker.settings import Settings, load_settings

log = logging.getLogger(__name__)

_STEP_TIMEOUT_S = 3600  # a 50,000-line ingest takes seconds; this only bounds a hang
_FAILED_TTL_S = 86400


@cache
def _settings() -> Settings:
    return load_settings()


def ingest(batch_id: str, token: str) -> None:
    _run(batch_id, token)


def progress(batch_id: str, token: str) -> None:
    _run(batch_id, token)


def cancel(batch_id: str, token: str) -> None:
    _run(batch_id, token)


def expire(batch_id: str) -> None:
    """Flag the batch as past its window, unless it has ended (its next step ends it)."""

    async def flag() -> None:
        redis = connect(_settings())
        try:
            if await redis.exists(keys.batch(batch_id)):
                await redis.hset(keys.batch(batch_id), batch_fields.EXPIRING, 1)
        finally:
            await redis.aclose()

    asyncio.run(flag())


def _run(batch_id: str, token: str) -> None:
    asyncio.run(_step(_settings(), batch_id, token))


async def _step(settings: Settings, batch_id: str, token: str) -> None:
    redis = connect(settings)
    ctx = StepContext(redis, settings, batch_id, token)
    backing_off = False
    try:
        await ctx.renew()
        await advance(ctx)
        await ctx.store.step_succeeded(batch_id)
    except LeaseLost:
        log.info("batch %s: step %s lost its lease; another step goes on", batch_id, token)
    except Exception as exc:  # counted on the batch, never retried for ever (failures)
        backing_off = await step_failed(ctx, exc)
    finally:
        if not backing_off:
            await ctx.release()
        await redis.aclose()


_STEPS = {"validating": ingest, "cancelling": cancel}


def sweep(redis: SyncRedis, queue: Queue, settings: Settings) -> int:
    """Enqueue one step for every active batch whose lease is free; returns how many."""
    lease_ms = settings.batch.lease_s * 1000
    started = 0
    for raw in cast(set[bytes], redis.smembers(keys.ACTIVE_BATCHES)):
        batch_id = raw.decode()
        status, scheduled, expires_at = replies.values(
            redis.hmget(
                keys.batch(batch_id),
                [batch_fields.STATUS, batch_fields.EXPIRY_SCHEDULED, batch_fields.EXPIRES_AT],
            )
        )
        if status is None:
            redis.srem(keys.ACTIVE_BATCHES, batch_id)
            continue
        if not scheduled and expires_at:
            when = datetime.fromtimestamp(int(expires_at), UTC)
            queue.enqueue_at(when, expire, batch_id, failure_ttl=_FAILED_TTL_S)
            redis.hset(keys.batch(batch_id), batch_fields.EXPIRY_SCHEDULED, 1)
        token = secrets.token_hex(8)
        if redis.set(keys.batch_lease(batch_id), token, nx=True, px=lease_ms):
            step = _STEPS.get(status.decode(), progress)
            queue.enqueue(
                step,
                batch_id,
                token,
                job_timeout=_STEP_TIMEOUT_S,
                result_ttl=0,
                failure_ttl=_FAILED_TTL_S,
            )
            started += 1
    return started
