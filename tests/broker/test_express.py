"""Express sends: the dispatcher's admission decision made ahead of time (grant.lua), used
by enqueue.lua for new jobs that find nothing queued ahead of them. Run against a real
Redis and against fakeredis, like the broker contract suite."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from redis.asyncio import Redis

from broker import (
    DispatchStore,
    ExecutionStore,
    ExpressSend,
    Grant,
    JobQueue,
    JobState,
    Outcome,
    Pick,
    Settings,
    StreamMode,
    express_send,
    keys,
)
from tests.support.contract import EP, MODEL, settings, submission

ALL = {"interactive": 3, "default": 3, "batch": 1}
TTL_MS = 60_000


async def _grant(d: DispatchStore, credits: dict[str, int], ttl_ms: int = TTL_MS) -> bool:
    sequence = (await d.snapshot(MODEL, 1)).sequence
    return await d.grant(MODEL, Grant(EP, credits), sequence, ttl_ms)


async def _credits(r: Redis, s: Settings) -> dict[str, int]:
    values = await r.hmget(keys.meta(MODEL), [keys.grant_field(b) for b in s.bands])
    return {b: int(v or 0) for b, v in zip(s.bands, values, strict=True)}


async def test_a_granted_job_goes_straight_to_the_ready_stream(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    assert await _grant(d, ALL)
    job_id = await q.submit(submission("alice"))
    assert (await q.get(job_id, "alice")).state is JobState.DISPATCHED
    ((_, entry),) = await r.xrange(keys.ready(MODEL))
    assert entry[b"j"].decode() == job_id and entry[b"ep"].decode() == EP
    assert entry[b"p"] == b'{"model":"m1"}' and entry[b"pr"] == b""
    snap = await d.snapshot(MODEL, 10)
    assert snap.empty and snap.inflight == {EP: 1} and snap.unstarted == {EP: 1}
    assert snap.sequence == 1
    assert await r.hget(keys.user_counts(MODEL), "alice") == b"1"
    assert await r.exists(keys.queue(MODEL, "default", "alice")) == 0
    # Every band's credits shrink by one: they share the endpoint's engine queue.
    assert await _credits(r, s) == {"interactive": 2, "default": 2, "batch": 0}


async def test_express_stops_when_the_credits_run_out(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    assert await _grant(d, {"default": 2})
    users = ("alice", "bob", "carol")
    jobs = [await q.submit(submission(user)) for user in users]
    states = [(await q.get(j, u)).state for j, u in zip(jobs, users, strict=True)]
    assert states == [JobState.DISPATCHED, JobState.DISPATCHED, JobState.QUEUED]
    assert await r.xlen(keys.ready(MODEL)) == 2


async def test_a_waiting_job_of_the_band_or_a_more_urgent_one_blocks_express(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    waiting = await q.submit(submission("alice"))  # no grant yet: it queues
    assert await _grant(d, ALL)
    later = await q.submit(submission("bob"))  # must not overtake alice's waiting job
    assert (await q.get(later, "bob")).state is JobState.QUEUED
    batch = await q.submit(submission("carol", band="batch"))
    assert (await q.get(batch, "carol")).state is JobState.QUEUED
    urgent = await q.submit(submission("dave", band="interactive"))  # a more urgent band
    assert (await q.get(urgent, "dave")).state is JobState.DISPATCHED
    assert (await q.get(waiting, "alice")).state is JobState.QUEUED


async def test_an_expired_grant_is_not_used(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    assert await _grant(d, ALL, ttl_ms=1)
    await asyncio.sleep(0.01)
    job_id = await q.submit(submission("alice"))
    assert (await q.get(job_id, "alice")).state is JobState.QUEUED


async def test_a_grant_computed_before_a_send_is_refused_and_a_revocation_always_applies(
    r: Redis,
) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    before = (await d.snapshot(MODEL, 1)).sequence
    assert await d.grant(MODEL, Grant(EP, ALL), before, TTL_MS)
    await q.submit(submission("alice"))  # an express send moves the sequence on
    assert not await d.grant(MODEL, Grant(EP, ALL), before, TTL_MS)
    assert await d.grant(MODEL, Grant(EP, ALL), before + 1, TTL_MS)
    assert await d.grant(MODEL, None, before, TTL_MS)  # revoking is always safe
    job_id = await q.submit(submission("bob"))
    assert (await q.get(job_id, "bob")).state is JobState.QUEUED
    assert await _credits(r, s) == {"interactive": 0, "default": 0, "batch": 0}


async def test_a_dispatch_revokes_the_grant_it_used_the_room_of(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    await q.submit(submission("alice"))
    assert await _grant(d, ALL)
    after = (await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)).snapshot
    assert after.sequence == 1 and after == await d.snapshot(MODEL, 10)
    job_id = await q.submit(submission("bob", band="interactive"))
    assert (await q.get(job_id, "bob")).state is JobState.QUEUED


async def test_an_express_job_runs_and_ends_like_a_dispatched_one(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await x.load_scripts()
    assert await _grant(d, ALL)
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.wake_channel(MODEL))
    job_id = await q.submit(submission("alice"))
    message = None
    while message is None:
        message = await pubsub.get_message(timeout=1.0)
    await pubsub.aclose()
    # It tells the dispatcher what was sent where: a streamed job, to EP, of a user who
    # had nothing in the engine (a newcomer: the next round may make room for it).
    assert express_send(message["data"]) == (EP, False, True)
    (claimed,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert claimed.job_id == job_id and claimed.endpoint == EP
    assert await x.start(claimed, "w1") == 1
    pipe = x.pipeline()
    x.add_complete(pipe, claimed, Outcome(JobState.COMPLETED))
    await pipe.execute()
    assert (await q.get(job_id, "alice")).state is JobState.COMPLETED
    snap = await d.snapshot(MODEL, 1)
    assert snap.inflight == {EP: 0} and snap.unstarted == {EP: 0}
    assert await r.hget(keys.user_counts(MODEL), "alice") is None


async def test_an_express_job_cancelled_before_a_worker_read_it_releases_its_room(
    r: Redis,
) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    assert await _grant(d, ALL)
    job_id = await q.submit(submission("alice"))
    assert (await q.cancel(job_id, "alice")).state is JobState.CANCELLED
    assert await x.claim(r, [MODEL], "w1", count=10, block_ms=50) == []
    snap = await d.snapshot(MODEL, 1)
    assert snap.inflight == {EP: 0} and snap.unstarted == {EP: 0}


async def test_an_express_job_taken_back_out_of_the_engine_can_be_cancelled(r: Redis) -> None:
    # Sent express, it was never in its user's queue (no queue entry): taken back, it waits
    # in the parked list only, and its cancel must find it there (a 503 once).
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    assert await _grant(d, ALL)
    jobs = [await q.submit(submission("alice")) for _ in range(2)]
    parked = await d.park(MODEL, EP)
    assert parked is not None and parked.job_id == jobs[1]
    assert (await q.get(jobs[1], "alice")).state is JobState.QUEUED
    assert (await q.cancel(jobs[1], "alice")).state is JobState.CANCELLED
    assert await r.llen(keys.parked(MODEL, "default", "alice")) == 0
    assert await r.zscore(keys.backlog(MODEL, "default"), "alice") is None
    assert await r.hget(keys.queued_counts(MODEL), "default") == b"0"


async def test_express_gives_the_engine_priority_a_dispatch_would(r: Redis) -> None:
    s = settings(model_fields={"engine_priority": True})
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    assert await _grant(d, ALL)
    await q.submit(submission("alice"))
    await q.submit(submission("alice", band="interactive"))
    claimed = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert [c.engine_priority for c in claimed] == [1_000_000, 1]


async def test_an_express_job_that_may_be_resumed_records_its_token_ids_like_a_dispatched_one(
    r: Redis,
) -> None:
    s = settings()  # resume_streams "exact": the worker asks a vLLM for token ids
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    assert await _grant(d, ALL)
    await q.submit(submission("alice"))
    not_streamed = replace(submission("alice"), stream_flag=StreamMode.PLAIN)  # never
    await q.submit(not_streamed)
    claimed = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert [c.track_tokens for c in claimed] == [True, False]


async def test_with_no_free_batch_slot_only_a_user_with_nothing_in_the_engine_goes_express(
    r: Redis,
) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    sequence = (await d.snapshot(MODEL, 1)).sequence
    assert await d.grant(MODEL, Grant(EP, ALL, served=1), sequence, TTL_MS)
    first = await q.submit(submission("alice"))  # takes the one free slot
    second = await q.submit(submission("alice"))  # in the engine now: waits for a slot
    # Nothing in the engine, and nothing queued ahead in its band: a kept slot.
    bob = await q.submit(submission("bob", band="interactive"))
    assert (await q.get(first, "alice")).state is JobState.DISPATCHED
    assert (await q.get(second, "alice")).state is JobState.QUEUED
    assert (await q.get(bob, "bob")).state is JobState.DISPATCHED


async def test_a_newcomer_sent_express_beyond_a_full_batch_makes_the_next_round_take_room(
    aredis: Redis,
) -> None:
    # Alice fills the batch of 2 and waits beyond it; bob goes express (nothing of his band
    # is queued) into the engine's queue. The round his send wakes takes one of alice's
    # back out of the engine, as it would had he been dispatched by the round itself.
    from dispatcher.service import Dispatcher

    config = {"name": MODEL, "endpoints": [EP], "batch_slots": 2, "reserved_slots": 0}
    s = settings(models=[config])
    q, d = JobQueue(aredis, s), DispatchStore(aredis, s)
    await ExecutionStore(aredis, s).ensure_groups([MODEL])
    alice = [await q.submit(submission("alice")) for _ in range(3)]
    picks = [Pick("default", "alice", i + 1, i + 0.5) for i in range(3)]
    await d.dispatch(MODEL, EP, 10, picks, 10)
    dispatcher = Dispatcher(s, aredis)
    await dispatcher.dispatch_model(s.models[0])

    async def states() -> list[JobState]:
        return [(await q.get(j, "alice")).state for j in alice]

    assert await states() == [JobState.DISPATCHED] * 3  # no newcomer: nothing taken back
    assert await _grant(d, ALL)
    await q.submit(submission("bob", band="interactive"))  # express
    dispatcher._express_sent(MODEL, ExpressSend(EP, plain=False, newcomer=True))
    await dispatcher.dispatch_model(s.models[0])
    assert JobState.QUEUED in await states()  # one of hers taken back for him
