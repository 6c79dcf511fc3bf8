"""A job's queue deadline of its own (``Submission.max_queue_ms``: a request's
X-Fairq-Max-Queue-S), enforced by the same sweep as the band's (expire.lua). Run against a
real Redis and against fakeredis, like the broker contract suite."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from redis.asyncio import Redis

from broker import DispatchStore, ExecutionStore, Grant, JobQueue, JobState, Pick, Submission, keys
from tests.support.contract import EP, MODEL, settings, submission

SOON_MS = 30  # a job's own deadline that a test then waits past
PAST_S = 0.06


def hurried(user: str, ms: int = SOON_MS, band: str = "default") -> Submission:
    """A job of ``user`` that may wait ``ms`` in the queue."""
    return replace(submission(user, band), max_queue_ms=ms)


async def test_a_job_past_its_own_deadline_ends_expired_and_the_next_in_its_queue_goes_on(
    r: Redis,
) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    ahead = await q.submit(submission("alice"))
    hurry = await q.submit(hurried("alice"))
    behind = await q.submit(submission("alice"))
    assert await x.expire(MODEL, "default", None) == []  # not due yet
    await asyncio.sleep(PAST_S)
    # From the middle of her queue: the band has no deadline, the jobs around it stay.
    assert await x.expire(MODEL, "default", None) == [hurry]
    assert (await q.get(hurry, "alice")).state is JobState.EXPIRED
    ended = await r.xrange(keys.results(MODEL, hurry))
    assert ended[-1][1][b"end"] == b"expired"
    assert await r.xlen(keys.queue(MODEL, "default", "alice")) == 2
    assert int(await r.hget(keys.queued_counts(MODEL), "default")) == 2
    assert await r.zcard(keys.own_deadlines(MODEL, "default")) == 0
    picks = [Pick("default", "alice", 1, 0)] * 2
    ids, _, _ = await d.dispatch(MODEL, EP, 4, picks, 10)
    assert ids == [ahead, behind]


async def test_a_users_only_job_expiring_gives_the_band_to_the_next_user(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    hurry = await q.submit(hurried("alice"))
    kept = await q.submit(submission("bob"))
    await asyncio.sleep(PAST_S)
    assert await x.expire(MODEL, "default", 60_000) == [hurry]  # the band's: not yet
    assert await r.zrange(keys.backlog(MODEL, "default"), 0, -1) == [b"bob"]
    assert await r.exists(keys.queue(MODEL, "default", "alice")) == 0
    assert int(await r.hget(keys.meta(MODEL), keys.tenant_field("default", "alice")) or 0) == 0
    ids, _, _ = await d.dispatch(MODEL, EP, 4, [Pick("default", "bob", 1, 0)], 10)
    assert ids == [kept]


async def test_a_job_dispatched_in_time_is_not_expired_and_leaves_the_index_once_due(
    r: Redis,
) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    job_id = await q.submit(hurried("alice"))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0)], 10)
    await asyncio.sleep(PAST_S)
    assert await x.expire(MODEL, "default", None) == []
    assert (await q.get(job_id, "alice")).state is JobState.DISPATCHED
    assert await r.zcard(keys.own_deadlines(MODEL, "default")) == 0


async def test_a_cancelled_job_leaves_the_index_once_due_and_nothing_is_counted_twice(
    r: Redis,
) -> None:
    s = settings()
    q, x = JobQueue(r, s), ExecutionStore(r, s)
    job_id = await q.submit(hurried("alice"))
    await q.submit(submission("alice"))
    await q.cancel(job_id, "alice")
    await asyncio.sleep(PAST_S)
    assert await x.expire(MODEL, "default", None) == []
    assert (await q.get(job_id, "alice")).state is JobState.CANCELLED
    assert int(await r.hget(keys.queued_counts(MODEL), "default")) == 1
    assert await r.zcard(keys.own_deadlines(MODEL, "default")) == 0


async def test_a_job_taken_back_out_of_the_engine_is_never_expired(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    ids = [await q.submit(hurried("alice")) for _ in "ab"]
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0)] * 2, 10)
    assert await d.park(MODEL, EP, min_jobs=2) == (ids[1], "alice")
    await asyncio.sleep(PAST_S)
    assert await x.expire(MODEL, "default", None) == []
    assert (await q.get(ids[1], "alice")).state is JobState.QUEUED  # parked: it ran once


async def test_a_deadline_not_due_stays_and_one_sent_express_has_none(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    sequence = (await d.snapshot(MODEL, 1)).sequence
    assert await d.grant(MODEL, Grant(EP, {"interactive": 1}), sequence, 60_000)
    express = await q.submit(hurried("bob", 60_000, "interactive"))
    assert (await q.get(express, "bob")).state is JobState.DISPATCHED
    assert await r.zcard(keys.own_deadlines(MODEL, "interactive")) == 0
    queued = await q.submit(hurried("alice", 60_000, "interactive"))
    assert await x.expire(MODEL, "interactive", None) == []
    assert await r.zrange(keys.own_deadlines(MODEL, "interactive"), 0, -1) == [queued.encode()]


async def test_more_jobs_due_than_one_call_ends_are_all_ended_by_the_sweep(r: Redis) -> None:
    s = settings()
    q, x = JobQueue(r, s), ExecutionStore(r, s)
    due = [await q.submit(hurried(u, 1)) for u in ("a", "b", "c")]
    due += [await q.submit(hurried("a", 1)) for _ in range(2)]
    await asyncio.sleep(PAST_S)
    assert sorted(await x.expire(MODEL, "default", None, budget=2)) == sorted(due)
    assert await r.zcard(keys.backlog(MODEL, "default")) == 0
    assert int(await r.hget(keys.queued_counts(MODEL), "default")) == 0
