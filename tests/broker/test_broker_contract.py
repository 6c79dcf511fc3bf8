"""The broker's Redis contract, run against a real Redis and against fakeredis.

Each test drives the Lua scripts through the public stores (JobQueue,
DispatchStore, ExecutionStore) and checks the state the contract promises.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace

import orjson
import pytest
from redis.asyncio import Redis

from broker import (
    Claimed,
    DispatchStore,
    ExecutionStore,
    JobQueue,
    JobState,
    Latency,
    Newcomer,
    NotFound,
    Outcome,
    Pick,
    QueueFull,
    Reclaim,
    RequestKind,
    Settings,
    StreamMode,
    TokenTrail,
    Unseen,
    WrittenEntry,
    add_latency,
    keys,
    parse_wake,
)
from broker.results import read_after
from tests.support.contract import EP, MODEL, settings, submission


async def test_enqueue_records_a_queued_job_and_backlogs_its_user(r: Redis) -> None:
    q = JobQueue(r, settings())
    job_id = await q.submit(submission("alice"))
    job = await q.get(job_id, "alice")
    assert job.state is JobState.QUEUED and job.user == "alice" and job.band == "default"
    assert await r.xlen(keys.queue(MODEL, "default", "alice")) == 1
    assert await r.zscore(keys.backlog(MODEL, "default"), "alice") is not None


async def test_a_full_user_queue_refuses_and_keeps_what_is_queued(r: Redis) -> None:
    q = JobQueue(r, settings(max_queued_per_user=2))
    first = [await q.submit(submission("alice")) for _ in range(2)]
    with pytest.raises(QueueFull) as info:
        await q.submit(submission("alice"))
    assert info.value.status == 429 and info.value.retry_after_s > 0
    assert await r.xlen(keys.queue(MODEL, "default", "alice")) == 2
    assert [(await q.get(j, "alice")).state for j in first] == [JobState.QUEUED] * 2
    await q.submit(submission("bob"))  # another user is not affected


async def test_another_users_job_is_not_found(r: Redis) -> None:
    q = JobQueue(r, settings())
    job_id = await q.submit(submission("alice"))
    with pytest.raises(NotFound):
        await q.get(job_id, "bob")
    with pytest.raises(NotFound):
        await q.cancel(job_id, "bob")
    assert (await q.get(job_id, "alice")).state is JobState.QUEUED


async def test_dispatch_moves_head_jobs_in_plan_order_and_counts_inflight(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    a = [await q.submit(submission("alice")) for _ in range(3)]
    b = await q.submit(submission("bob"))
    picks = [Pick("default", "alice", 1, 0.5), Pick("default", "bob", 2, 1.5)]
    ids, after, plain = await d.dispatch(MODEL, EP, 4, picks, 10)
    assert ids == [a[0], b] and plain == 0  # both streamed
    assert after == await d.snapshot(MODEL, depth=10)  # the script reports the state after
    snap = await d.snapshot(MODEL, depth=10)
    assert snap.inflight == {EP: 2}
    assert [u for u, _ in snap.backlogs[0].users] == ["alice"]  # bob's queue is empty
    assert snap.backlogs[0].join == 1.5
    ready = await r.xrange(keys.ready(MODEL))
    assert [f[b"j"].decode() for _, f in ready] == [a[0], b]
    assert [f[b"p"] for _, f in ready] == [b'{"model":"m1"}'] * 2  # the payload moved along
    assert await r.hget(keys.job(MODEL, b), "p") is None
    assert (await q.get(b, "bob")).state is JobState.DISPATCHED


async def test_dispatch_of_an_emptied_queue_dispatches_nothing_and_cleans_backlog(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    job_id = await q.submit(submission("alice"))
    await q.cancel(job_id, "alice")
    assert await r.zcard(keys.backlog(MODEL, "default")) == 0
    assert (await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10))[0] == []
    assert await r.xlen(keys.ready(MODEL)) == 0


async def test_cancel_of_a_queued_job_removes_it_and_ends_its_stream(r: Redis) -> None:
    q = JobQueue(r, settings())
    job_id = await q.submit(submission("alice"))
    job = await q.cancel(job_id, "alice")
    assert job.state is JobState.CANCELLED
    assert await r.exists(keys.queue(MODEL, "default", "alice")) == 0
    entries = await r.xrange(keys.results(MODEL, job_id))
    assert entries[-1][1][b"end"] == b"cancelled"
    assert (await q.cancel(job_id, "alice")).state is JobState.CANCELLED  # idempotent


async def test_start_and_complete_end_the_job_once_and_release_capacity(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    job_id = await q.submit(submission("alice"))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)
    (claimed,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert claimed.endpoint == EP and claimed.payload == b'{"model":"m1"}'
    assert claimed.kind is RequestKind.CHAT and claimed.stream
    assert await x.start(claimed, "w1") == 1
    outcome = Outcome(JobState.COMPLETED, usage={"completion_tokens": 3}, finish_reason="stop")
    await x.load_scripts()
    for _ in range(2):  # a retried write: the chunk is refused, the completion ignored
        pipe = x.pipeline()
        x.add_chunk(pipe, MODEL, job_id, b"0-1", b"data: {}\n\n")
        x.add_complete(pipe, claimed, outcome)
        replies = await pipe.execute(raise_on_error=False)
    assert x.is_duplicate_write(replies[0]) and replies[1] == 0
    entries = await r.xrange(keys.results(MODEL, job_id))
    assert next(e[0] for e in entries) == b"0-1" and len(entries) == 2  # chunk once, then end
    job = await q.get(job_id, "alice")
    assert job.state is JobState.COMPLETED and job.usage == {"completion_tokens": 3}
    assert (await d.snapshot(MODEL, 1)).inflight == {EP: 0}
    pending = await r.xpending(keys.ready(MODEL), keys.READY_GROUP)
    assert pending["pending"] == 0
    assert await r.xlen(keys.ready(MODEL)) == 0  # the entry and its payload copy are gone
    assert await r.ttl(keys.job(MODEL, job_id)) > 0


async def test_an_accepted_start_marks_the_results_once_before_any_output(r: Redis) -> None:
    """start.lua's acceptance mark: entry 0-1 when the engine accepted the streamed request,
    none when it did not, and none once output has landed (the mark would come after it)."""
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    jobs = [await q.submit(submission("alice")) for _ in range(3)]
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", i + 1, i + 0.5) for i in range(3)], 10)
    claimed = {c.job_id: c for c in await x.claim(r, [MODEL], "w1", count=10, block_ms=100)}
    accepted, refused, late = (claimed[j] for j in jobs)
    await x.load_scripts()
    pipe = x.pipeline()
    x.add_chunk(pipe, MODEL, late.job_id, x.entry_id(late, 1), b"data: {}\n\n")
    await pipe.execute()
    assert await x.start(accepted, "w1", accepted=True) == 1
    assert await x.start(refused, "w1", accepted=False) == 1
    assert await x.start(late, "w1", accepted=True) == 1

    async def entries(job_id: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
        return [(i, f) for i, f in await r.xrange(keys.results(MODEL, job_id))]

    assert await entries(accepted.job_id) == [(b"0-1", {b"ok": b""})]
    assert await entries(refused.job_id) == []
    assert await entries(late.job_id) == [(b"0-2", {b"d": b"data: {}\n\n"})]
    # Readers see the mark as no output; the worker's first output lands after it.
    (mark,) = await read_after(r, MODEL, accepted.job_id, b"0-0")
    assert mark.accepted and mark.chunk is None and mark.body is None and mark.end is None
    assert x.entry_id(accepted, 1) == b"0-2"


async def test_a_job_cancelled_before_a_worker_read_it_is_never_handed_out(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    job_id = await q.submit(submission("alice"))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)
    await q.cancel(job_id, "alice")
    assert await x.claim(r, [MODEL], "w1", count=10, block_ms=50) == []
    assert (await d.snapshot(MODEL, 1)).inflight == {EP: 0}


async def test_a_job_cancelled_after_a_worker_read_it_is_not_started(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    job_id = await q.submit(submission("alice"))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)
    (claimed,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    await q.cancel(job_id, "alice")
    assert await x.start(claimed, "w1") is None
    assert (await q.get(job_id, "alice")).state is JobState.CANCELLED
    assert (await d.snapshot(MODEL, 1)).inflight == {EP: 0}
    assert await r.xpending(keys.ready(MODEL), keys.READY_GROUP) == {
        "pending": 0,
        "min": None,
        "max": None,
        "consumers": [],
    }


async def test_a_newcomer_joins_at_the_bands_clock(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    for _ in range(2):
        await q.submit(submission("alice"))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 7, 6.5)], 10)
    await q.submit(submission("bob"))
    assert await r.zscore(keys.backlog(MODEL, "default"), "bob") == 6.5


async def test_dispatch_never_takes_an_endpoint_past_its_cap(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    jobs = [await q.submit(submission("alice")) for _ in range(3)]
    picks = [Pick("default", "alice", i + 1, i + 0.5) for i in range(3)]
    ids, after, _ = await d.dispatch(MODEL, EP, 2, picks, 10)
    assert ids == jobs[:2]
    assert after.inflight == {EP: 2}
    assert (await q.get(jobs[2], "alice")).state is JobState.QUEUED
    assert [u for u, _ in after.backlogs[0].users] == ["alice"]


async def test_wake_messages_name_newcomers_only(r: Redis) -> None:
    q = JobQueue(r, settings())
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.wake_channel(MODEL))
    await q.submit(submission("alice"))
    await q.submit(submission("alice"))
    messages = []
    while len(messages) < 2:
        message = await pubsub.get_message(timeout=1.0)
        if message is not None:
            messages.append(parse_wake(message["data"]))
    await pubsub.aclose()
    assert messages == [Newcomer("default", "alice", 0.0), None]


async def _dispatch_rounds(d: DispatchStore, rounds: int) -> list[str]:
    """Dispatch one job per round with the token-fair policy, as the dispatcher would."""
    from dispatcher.fairness import TokenFair

    served = []
    for _ in range(rounds):
        snap = await d.snapshot(MODEL, 10)
        top = snap.backlogs[0]
        (pick,) = TokenFair().plan(top.band, top.users, top.join, 1)
        ids = (await d.dispatch(MODEL, EP, 10**6, [pick], 10)).ids
        served += [pick.user] * len(ids)
    return served


async def test_token_fair_charges_each_jobs_cost_over_the_keys_weight(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    for _ in range(20):
        await q.submit(replace(submission("big"), cost=300.0))
        await q.submit(replace(submission("small"), cost=100.0))
        await q.submit(replace(submission("vip"), cost=300.0, weight=3.0))
    served = await _dispatch_rounds(d, 15)
    # Per job the score grows by: small 100, vip 300/3 = 100, big 300 -> served 3:3:1,
    # ties going to the name first in order (as in the Redis sorted set).
    assert served[:8] == ["big", "small", "vip", "small", "vip", "small", "vip", "big"]
    assert (served.count("small"), served.count("vip"), served.count("big")) == (6, 6, 3)


async def test_token_fair_corrects_the_charge_to_reported_usage(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await x.load_scripts()
    for _ in range(2):
        await q.submit(replace(submission("alice"), cost=1000.0, weight=2.0))
    await _dispatch_rounds(d, 1)
    assert await r.zscore(keys.backlog(MODEL, "default"), "alice") == 500.0
    (claimed,) = await x.claim(r, [MODEL], "w1", count=1, block_ms=100)
    usage = {"prompt_tokens": 100, "completion_tokens": 50}  # 100 x 1 + 50 x 2 = 200
    pipe = x.pipeline()
    x.add_complete(pipe, claimed, Outcome(JobState.COMPLETED, usage=usage))
    await pipe.execute()
    assert await r.zscore(keys.backlog(MODEL, "default"), "alice") == 100.0  # 200 / 2


async def test_engine_priority_is_band_first_then_the_users_jobs_in_the_engine(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await x.load_scripts()
    for _ in range(3):
        await q.submit(submission("alice"))
    await q.submit(submission("bob", band="interactive"))
    picks = [Pick("default", "alice", i + 1, i + 0.5) for i in range(3)]
    picks.append(Pick("interactive", "bob", 1, 0.5))
    await d.dispatch(MODEL, EP, 100, picks, 10, engine_priority=True)
    claimed = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert [(c.user, c.engine_priority) for c in claimed] == [
        ("alice", 1_000_000),
        ("alice", 1_000_001),
        ("alice", 1_000_002),
        ("bob", 0),
    ]
    pipe = x.pipeline()
    x.add_complete(pipe, claimed[0], Outcome(JobState.COMPLETED))
    await pipe.execute()
    assert await r.hget(keys.user_counts(MODEL), "alice") == b"2"


async def test_without_engine_priority_no_priority_is_sent(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await q.submit(submission("alice"))
    await d.dispatch(MODEL, EP, 100, [Pick("default", "alice", 1, 0.5)], 10)
    (claimed,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert claimed.engine_priority is None


def test_jobs_ahead_counts_higher_bands_own_earlier_jobs_and_other_users_turns() -> None:
    from broker.position import jobs_ahead

    assert jobs_ahead(0, [], [], 0) == 0
    assert jobs_ahead(0, [5], [5], 0) == 1  # one turn of the user before us
    assert jobs_ahead(2, [5, 1], [5], 4) == 4 + 2 + (3 + 1) + 2


def test_the_drain_is_fairqs_jobs_in_the_engine_over_the_time_one_stays_there() -> None:
    from broker.position import drain_of

    # 32 in the engine, recent ones stayed 16 s on average: 2 leave per second
    drain = drain_of(32, [10_000, 22_000], [], 9.0)
    assert drain is not None and (drain.per_s, drain.stay_s) == (2.0, 16.0)
    assert drain.remaining_s == (16.0,) * 32  # none's age read: as if just started
    # ...but those in the engine now have stayed 32 s on average and are not done
    drain = drain_of(2, [10_000, 22_000], [34_000, 30_000], 9.0)
    assert drain is not None and (drain.per_s, drain.remaining_s) == (1 / 16, (0.0, 2.0))
    # a flood's first second: nothing of it ended yet (only others' short answers)
    drain = drain_of(4, [100], [500, 500, 500], None)
    assert drain is not None and drain.per_s == 8.0 and drain.remaining_s == (0, 0, 0, 0.5)
    engine = drain_of(32, [], [], 9.0)  # no time known: the engines' own figure
    assert engine is not None and (engine.per_s, engine.stay_s) == (9.0, None)
    assert drain_of(0, [16_000], [], 9.0) == engine  # nothing of fairq's in the engine
    assert drain_of(32, [], [], None) is None and drain_of(32, [], [], 0.0) is None
    drain = drain_of(2, [0, 1], [], None)  # ended at once: fast, not endless
    assert drain is not None and drain.per_s == 2000.0


def test_the_wait_is_the_later_of_the_drains_rate_and_the_next_slots_to_free() -> None:
    from broker.position import Drain, wait_s

    assert wait_s(0, Drain(2.0)) == 0.5  # nothing ahead: the next job to end makes room
    assert wait_s(5, Drain(2.0)) == 3.0  # by the rate alone: 6 ends at 2 per second
    assert wait_s(3, None) is None
    # 31 answers started together 1.6 s ago and stay 18 s: they end together in 16.4 s,
    # and the job 37th in line needs one of the next 31 ends, a stay later
    wave = Drain(31 / 18, 18.0, (16.4,) * 31)
    assert wait_s(37, wave) == 34.4  # by the rate: 22 s
    assert wait_s(5, wave) == 16.4
    assert wait_s(0, wave, newcomer=True) == 0.6  # a kept slot, not the wave's end: 18 / 31
    # a long straggler among short ones: the rate is the later figure
    mixed = Drain(4 / 10, 10.0, (0.0, 0.0, 0.0, 9.0))
    assert wait_s(3, mixed) == 10.0 and wait_s(2, mixed) == 7.5


async def _publish_engine_drain(r: Redis, per_endpoint: list[float | None]) -> None:
    """What a dispatcher's status snapshot says of the engines (dispatcher.publisher)."""
    rows = [{"url": f"{EP}{i}", "drain_per_s": d} for i, d in enumerate(per_endpoint)]
    await r.set(keys.status(MODEL), orjson.dumps({"model": MODEL, "endpoints": rows}))


async def test_a_queued_job_knows_how_many_jobs_go_before_it_and_how_long(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    for _ in range(3):
        await q.submit(submission("urgent", band="interactive"))
    a = [await q.submit(submission("alice")) for _ in range(4)]
    b = [await q.submit(submission("bob")) for _ in range(2)]
    assert await r.hgetall(keys.queued_counts(MODEL)) == {b"interactive": b"3", b"default": b"6"}
    # alice's third job waits for 3 interactive jobs, her own 2, and bob's 2 (turns before it)
    position = await q.position(await q.get(a[2], "alice"))
    assert position is not None and position.jobs_ahead == 3 + 2 + 2
    assert position.estimated_wait_s is None  # no dispatcher has told the engines' drain
    await d.dispatch(MODEL, EP, 100, [Pick("interactive", "urgent", 1, 0.5)], 10)
    await _publish_engine_drain(r, [1.5, None, 0.5])
    position = await q.position(await q.get(b[1], "bob"))
    assert position is not None and position.jobs_ahead == 2 + 1 + 2  # alice's turn comes first
    assert position.estimated_wait_s == (5 + 1) / 2.0
    await q.cancel(a[3], "alice")
    assert await r.hgetall(keys.queued_counts(MODEL)) == {b"interactive": b"2", b"default": b"5"}
    assert await q.position(await q.get(a[3], "alice")) is None  # no longer queued


async def test_a_queued_job_has_a_wait_at_once_from_the_jobs_in_the_engine_then_their_ends(
    r: Redis,
) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    for _ in range(3):
        await q.submit(submission("alice"))
    picks = [Pick("default", "alice", 1, 0.5), Pick("default", "alice", 2, 0.5)]
    before_dispatch = time.monotonic()  # their ages in the engine count from here
    await d.dispatch(MODEL, EP, 100, picks, 10)  # 2 of alice's jobs in the engine
    await _publish_engine_drain(r, [2.0])  # what the engine's metrics say (a dispatcher)
    bob = await q.submit(submission("bob"))
    position = await q.position(await q.get(bob, "bob"))
    assert position is not None and position.jobs_ahead == 0  # a newcomer goes first
    assert position.estimated_wait_s == 1 / 2.0  # no worker holds a job yet: the engines'
    await x.claim(r, [MODEL], "w1", count=10, block_ms=100)  # a worker runs both
    await asyncio.sleep(0.2)
    position = await q.position(await q.get(bob, "bob"))
    # the two in the engine stayed >= 0.2 s and are not done: at most 2 per stay leave
    # (the stay measured here: a loaded machine lengthens it)
    assert position is not None and position.estimated_wait_s is not None
    assert 0.1 <= position.estimated_wait_s <= (time.monotonic() - before_dispatch) / 2 + 0.05
    async with r.pipeline(transaction=False) as pipe:  # alice's earlier jobs ended (workers)
        add_latency(pipe, MODEL, Latency("default", 5, 40, run_ms=3_000))
        add_latency(pipe, MODEL, Latency("default", 5, 40, run_ms=5_000))
        await pipe.execute()
    position = await q.position(await q.get(bob, "bob"))
    # fairq's own drain now: 2 jobs in the engine over 4 s each = 0.5 per second
    assert position is not None and position.estimated_wait_s == 1 / 0.5
    alice = await q.get((await q.submit(submission("alice"))), "alice")
    position = await q.position(alice)  # her fourth job, behind her third and bob's
    # alice has jobs in the engine: hers waits for a slot. The 2 ahead take the two that
    # free in ~3.8 s (what is left of 4 s stays); hers frees a stay later: ~7.8 s
    stayed = time.monotonic() - before_dispatch
    assert position is not None and position.jobs_ahead == 2
    assert position.estimated_wait_s is not None
    assert 8.0 - stayed - 0.1 <= position.estimated_wait_s <= 7.9


async def test_token_fair_shares_by_tenant_first_then_equally_inside_a_tenant(r: Redis) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    for _ in range(20):
        for user, tenant in (("u1", "team"), ("u2", "team"), ("v", "solo")):
            await q.submit(replace(submission(user), tenant=tenant, cost=100.0))
    served = await _dispatch_rounds(d, 28)
    # Each team member pays double per job while both are backlogged: per round of four
    # picks the one-user tenant gets two, the team two, split equally.
    assert served[:8] == ["u1", "u2", "v", "v", "u1", "u2", "v", "v"]
    assert (served.count("v"), served.count("u1"), served.count("u2")) == (14, 7, 7)
    assert await r.hget(keys.meta(MODEL), keys.tenant_field("default", "team")) == b"2"


async def test_tenant_user_counts_follow_users_leaving_the_backlog(r: Redis) -> None:
    s = settings()
    q = JobQueue(r, s)
    jobs = [await q.submit(replace(submission(u), tenant="team")) for u in ("u1", "u2")]
    field = keys.tenant_field("default", "team")
    assert await r.hget(keys.meta(MODEL), field) == b"2"
    await q.cancel(jobs[0], "u1")
    assert await r.hget(keys.meta(MODEL), field) == b"1"
    await _dispatch_rounds(DispatchStore(r, s), 1)
    assert await r.hget(keys.meta(MODEL), field) == b"0"


async def test_jobs_a_scrape_cannot_show_are_in_transit_or_handed_over_just_now(
    r: Redis,
) -> None:
    # Admission adds these to what the engine last reported: they are in no engine metric.
    s = settings(lease_ms=100, lease_renew_ms=50)
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])

    async def transit() -> int:
        return int(await r.hget(keys.transit(MODEL), EP) or 0)

    jobs = [await q.submit(submission(u)) for u in ("u1", "u2", "u3")]
    picks = [Pick("default", u, i, i) for i, u in enumerate(("u1", "u2", "u3"), start=1)]
    await d.dispatch(MODEL, EP, 4, picks, 10)
    assert await transit() == 3 and await d.unseen([MODEL], EP, 60_000) == Unseen(3, 0, 3)
    claimed = {c.job_id: c for c in await x.claim(r, [MODEL], "w1", count=10, block_ms=100)}
    assert await x.start(claimed[jobs[0]], "w1") == 1  # reached the engine
    assert await transit() == 2
    # Within the engine's metrics lag the started job may be missing from a sample too
    # (streamed: until its first token, which admission sees without a scrape).
    assert await d.unseen([MODEL], EP, 60_000) == Unseen(2, 1, 3, 1)
    await asyncio.sleep(0.01)
    # Past the lag a sample shows it (the last count: running or waiting there).
    assert await d.unseen([MODEL], EP, 5) == Unseen(2, 0, 3, 0, 1)
    # Past the lag but within the start window it may wait for the engine's next step.
    assert await d.unseen([MODEL], EP, 5, start_ms=60_000) == Unseen(2, 0, 3, 1, 1)
    await q.cancel(jobs[1], "u2")  # cancelled on its way
    assert await transit() == 1
    await x.load_scripts()
    pipe = x.pipeline()  # ended by a worker before it started (e.g. a shutdown)
    x.add_complete(pipe, claimed[jobs[2]], Outcome(JobState.FAILED))
    await pipe.execute()
    assert await transit() == 0
    # The started job's worker dies: reclaimed for a retry, it is on its way again.
    await asyncio.sleep(0.2)
    (taken,) = await x.reclaim(MODEL, "w2", 10)
    assert taken.decision is Reclaim.RETRY and taken.job.job_id == jobs[0]
    assert await transit() == 1
    assert await x.start(taken.job, "w2") == 2
    assert await transit() == 0
    await asyncio.sleep(0.01)
    assert await d.unseen([MODEL], EP, 5) == Unseen(0, 0, 1, 0, 1)
    assert await d.unseen([MODEL, "other"], "http://elsewhere", 60_000) == Unseen(0, 0)


async def test_a_job_handed_over_just_now_is_unseen_until_the_scrape_if_plain_and_until_its_first_token_if_streamed(  # noqa: E501
    r: Redis,
) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await x.load_scripts()
    plain = await q.submit(replace(submission("u1"), stream_flag=StreamMode.PLAIN))
    streamed = await q.submit(submission("u2"))
    picks = [Pick("default", u, i, i) for i, u in enumerate(("u1", "u2"), start=1)]
    await d.dispatch(MODEL, EP, 4, picks, 10)
    for claimed in await x.claim(r, [MODEL], "w1", count=10, block_ms=100):
        assert await x.start(claimed, "w1") == 1
    assert await d.unseen([MODEL], EP, 60_000) == Unseen(1, 1, 2, 1)
    for job_id in (plain, streamed):  # the plain one handed over its body, the other a token
        pipe = x.pipeline()
        x.add_first(pipe, MODEL, job_id)
        await pipe.execute()
    # The plain job may still wait in the engine's queue; the streamed one has left it.
    assert await d.unseen([MODEL], EP, 60_000) == Unseen(1, 0, 0)


async def test_a_running_job_shows_its_first_token_time_from_its_first_output_and_keeps_it(
    r: Redis,
) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await x.load_scripts()
    job_id = await q.submit(submission("alice"))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)
    (claimed,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert await x.start(claimed, "w1") == 1
    assert (await q.get(job_id, "alice")).public()["first_token_at_ms"] is None
    first_ms = int(time.time() * 1000)
    for at_ms in (first_ms, first_ms + 50):  # a later attempt's first output: the first stays
        pipe = x.pipeline()
        x.add_first(pipe, MODEL, job_id, at_ms)
        await pipe.execute()
    job = await q.get(job_id, "alice")
    assert job.state is JobState.RUNNING and job.public()["first_token_at_ms"] == first_ms
    pipe = x.pipeline()
    x.add_complete(pipe, claimed, Outcome(JobState.COMPLETED, first_token_ms=first_ms + 50))
    assert await pipe.execute() == [1]
    job = await q.get(job_id, "alice")
    assert job.state is JobState.COMPLETED and job.first_token_ms == first_ms
    # A record Redis lost is not made again by a late first output.
    await r.delete(keys.job(MODEL, job_id))
    pipe = x.pipeline()
    x.add_first(pipe, MODEL, job_id, first_ms)
    assert await pipe.execute() == [0]
    assert await r.exists(keys.job(MODEL, job_id)) == 0


async def test_dispatch_counts_the_jobs_that_are_not_streamed(r: Redis) -> None:
    # Admission counts these apart: fairq cannot see them leave the engine's queue.
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    await q.submit(submission("alice"))
    await q.submit(replace(submission("bob"), stream_flag=StreamMode.PLAIN))
    picks = [Pick("default", "alice", 1, 0.5), Pick("default", "bob", 2, 1.5)]
    ids, _, plain = await d.dispatch(MODEL, EP, 4, picks, 10)
    assert len(ids) == 2 and plain == 1


async def test_a_user_in_the_engine_is_skipped_beyond_the_served_cap_and_keeps_their_place(
    r: Redis,
) -> None:
    s = settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    for _ in range(3):
        await q.submit(submission("alice"))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)
    bob = await q.submit(submission("bob"))
    # One job in flight; users already in the engine may only take it to 1 (kept slots).
    picks = [Pick("default", "alice", 2, 1.5), Pick("default", "bob", 3, 2.5)]
    ids, after, _ = await d.dispatch(MODEL, EP, 4, picks, 10, served_cap=1)
    assert ids == [bob]
    assert after.inflight == {EP: 2}
    assert await r.zscore(keys.backlog(MODEL, "default"), "alice") == 1.0  # not rescored
    assert after.in_engine == {"alice": 1}  # the users reported, with their jobs in the engine
    fresh = await d.snapshot(MODEL, 10, in_engine=True)
    assert fresh.in_engine == after.in_engine and fresh.backlogs == after.backlogs


# --- park.lua: a job without output taken back out of the engine (preemption) -----------


RESUMING = settings(model_fields={"resume_streams": True})


async def _in_engine(
    r: Redis, user: str, n: int, payload: bytes = b'{"model":"m1"}', s: Settings | None = None
) -> tuple[list[str], DispatchStore]:
    s = s or settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    await ExecutionStore(r, s).ensure_groups([MODEL])
    jobs = [await q.submit(replace(submission(user), payload=payload)) for _ in range(n)]
    picks = [Pick("default", user, i + 1, i + 0.5) for i in range(n)]
    await d.dispatch(MODEL, EP, 10, picks, 10)
    return jobs, d


async def test_park_takes_the_heaviest_users_newest_job_back_to_the_head_of_their_queue(
    r: Redis,
) -> None:
    jobs, d = await _in_engine(r, "alice", 3)
    q = JobQueue(r, settings())
    await _in_engine(r, "bob", 1)
    later = await q.submit(submission("alice"))  # queued behind what comes back
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(keys.cancel_channel(MODEL))
    parked = await d.park(MODEL, EP)
    assert parked is not None and parked.job_id == jobs[-1] and parked.user == "alice"
    message = None
    for _ in range(20):  # the first reads may only confirm the subscription
        message = message or await pubsub.get_message(timeout=0.1)
    await pubsub.aclose()
    # Its worker drops that attempt: the notice names the job and the attempt's ready entry.
    assert message is not None
    job_id, entry = message["data"].decode().split(" ")
    assert job_id == jobs[-1] and re.fullmatch(r"\d+-\d+", entry)
    snap = await d.snapshot(MODEL, 10, in_engine=True)
    assert snap.inflight == {EP: 3} and snap.unstarted == {EP: 3}
    assert snap.in_engine == {"alice": 2}
    assert (await q.get(jobs[-1], "alice")).state is JobState.QUEUED
    # Served again before the job queued after it, with its payload.
    ids, _, _ = await d.dispatch(MODEL, EP, 10, [Pick("default", "alice", 9, 8.5)], 10)
    assert ids == [jobs[-1]]
    ((_, entry),) = [e for e in await r.xrange(keys.ready(MODEL)) if e[1][b"j"] == ids[0].encode()]
    assert entry[b"p"] == b'{"model":"m1"}'
    assert (await q.get(later, "alice")).state is JobState.QUEUED


async def test_park_young_takes_only_a_job_without_output_handed_over_within_the_bound(
    r: Redis,
) -> None:
    # A newcomer's prefill step is cleared of the refills handed over within the last step
    # (dispatcher.newcomer_step): jobs older than the bound stay, whatever their count.
    old, d = await _in_engine(r, "alice", 3, s=RESUMING)
    await _sent_output(r, old[:1])  # resumable and with output: mid-answer, never young
    await asyncio.sleep(0.3)
    assert await d.park(MODEL, EP, young_ms=150) is None
    q = JobQueue(r, RESUMING)
    young = [await q.submit(submission("alice")) for _ in range(2)]
    picks = [Pick("default", "alice", 10 + i, 9.5 + i) for i in range(2)]
    await d.dispatch(MODEL, EP, 10, picks, 10)
    await _sent_output(r, young[1:])  # the newest has output: the one before it goes
    parked = await d.park(MODEL, EP, young_ms=150)
    assert parked is not None and parked.job_id == young[0] and parked.user == "alice"
    assert await d.park(MODEL, EP, young_ms=150) is None  # none left young without output
    # Nor one not streamed: nothing tells whether its prefill is done (no output till its end).
    for _ in range(2):
        await q.submit(replace(submission("carol"), stream_flag=StreamMode.PLAIN))
    picks = [Pick("default", "carol", 20 + i, 19.5 + i) for i in range(2)]
    assert len((await d.dispatch(MODEL, EP, 10, picks, 10)).ids) == 2
    assert await d.park(MODEL, EP, young_ms=150) is None
    snap = await d.snapshot(MODEL, 10, in_engine=True)
    assert snap.inflight == {EP: 6} and snap.in_engine == {"alice": 4}  # the backlogged
    assert (await q.get(young[0], "alice")).state is JobState.QUEUED
    # Without the bound the same call takes the newest job without output, however old.
    parked = await d.park(MODEL, EP)
    assert parked is not None and parked.job_id == old[-1]


async def _sent_output(
    r: Redis, jobs: list[str], trail: TokenTrail | None = None
) -> ExecutionStore:
    x = ExecutionStore(r, settings())
    await x.load_scripts()
    for job_id in jobs:
        pipe = x.pipeline()
        x.add_chunk(pipe, MODEL, job_id, b"0-1", b"data: {}\n\n", trail=trail)
        x.add_first(pipe, MODEL, job_id)
        await pipe.execute()
    return x


async def test_park_never_takes_a_job_with_output_that_cannot_go_on_nor_a_users_only_job(
    r: Redis,
) -> None:
    # Several choices cannot be continued from one text: taking one back would repeat it.
    jobs, d = await _in_engine(r, "alice", 2, payload=b'{"model":"m1","n":2}', s=RESUMING)
    await _sent_output(r, jobs)
    await _in_engine(r, "bob", 1)
    assert await d.park(MODEL, EP) is None
    assert (await d.snapshot(MODEL, 1)).inflight == {EP: 3}


async def test_a_streamed_job_with_output_is_taken_back_behind_a_fence_to_go_on_later(
    r: Redis,
) -> None:
    jobs, d = await _in_engine(r, "alice", 3, s=RESUMING)
    x = await _sent_output(r, jobs)
    parked = await d.park(MODEL, EP)
    # Her oldest answer: nearest its end, the pause makes it no straggler of her flood.
    assert parked is not None and parked.job_id == jobs[0]
    # Late writes of the worker that ran it are refused, however many it still had on
    # their way: the fence is 1-0 and their ids are 0-n (ids only grow).
    pipe = x.pipeline()
    x.add_chunk(pipe, MODEL, parked.job_id, b"0-2", b"data: {}\n\n")
    x.add_chunk(pipe, MODEL, parked.job_id, b"0-3", b"data: {}\n\n")
    replies = await pipe.execute(raise_on_error=False)
    assert all(x.is_duplicate_write(reply) for reply in replies)
    assert await r.hget(keys.job(MODEL, parked.job_id), "rsq") == b"1"
    ids, _, _ = await d.dispatch(MODEL, EP, 10, [Pick("default", "alice", 9, 8.5)], 10)
    assert ids == [parked.job_id]
    (claimed,) = [
        c for c in await x.claim(r, [MODEL], "w2", count=10, block_ms=100)
        if c.job_id == parked.job_id
    ]  # fmt: skip
    assert claimed.resume_gen == 1 and x.entry_id(claimed, 1) == b"1-2"  # what it writes
    assert await x.written(claimed) == [WrittenEntry(b"data: {}\n\n")]  # what its client has


async def test_a_job_taken_back_before_its_first_output_is_fenced_and_starts_afresh(
    r: Redis,
) -> None:
    quick = settings(lease_ms=100, lease_renew_ms=50)
    jobs, d = await _in_engine(r, "alice", 2, s=quick)
    x = ExecutionStore(r, quick)
    await x.load_scripts()
    parked = await d.park(MODEL, EP)
    assert parked is not None and parked.job_id == jobs[-1]
    # The first chunk of the worker that ran it, on its way as it was taken back, is
    # refused: its client never sees another attempt's opening.
    pipe = x.pipeline()
    x.add_chunk(pipe, MODEL, parked.job_id, b"0-2", b"data: {}\n\n")
    (reply,) = await pipe.execute(raise_on_error=False)
    assert x.is_duplicate_write(reply)

    async def next_attempt(worker: str) -> Claimed:
        await d.dispatch(MODEL, EP, 10, [Pick("default", "alice", 9, 8.5)], 10)
        claimed = await x.claim(r, [MODEL], worker, count=10, block_ms=100)
        return next(c for c in claimed if c.job_id == parked.job_id)

    again = await next_attempt("w2")
    assert again.resume_gen == 1 and await x.written(again) == []  # it starts afresh
    assert await x.start(again, "w2", accepted=True) == 1  # the engine took it: mark 1-1
    # A fence or an acceptance mark is no output: taken back again from scratch (not
    # mid-answer), and once more fenced...
    assert await d.park(MODEL, EP) == parked
    job = keys.job(MODEL, parked.job_id)
    assert await r.hget(job, "rsq") == b"2" and await r.hget(job, "pkm") is None
    # ...and retried, not failed, when the worker that ran it dies before its first output.
    assert await x.start(await next_attempt("w3"), "w3", accepted=True) == 1
    await asyncio.sleep(0.2)
    taken = await x.reclaim(MODEL, "w4", 10)
    assert (parked.job_id, Reclaim.RETRY) in [(t.job.job_id, t.decision) for t in taken]


async def test_an_attempt_taken_back_cannot_end_the_job_it_ran_even_on_the_same_worker(
    r: Redis,
) -> None:
    """park.lua took w1's attempt back and the job came to w1 again: the earlier attempt's
    end (its engine finished before w1 read the notice) is refused; the new one's counts."""
    _, d = await _in_engine(r, "alice", 2)
    x = ExecutionStore(r, settings())
    await x.load_scripts()
    first = {c.job_id: c for c in await x.claim(r, [MODEL], "w1", count=10, block_ms=100)}
    for claimed in first.values():
        assert await x.start(claimed, "w1") == 1
    parked = await d.park(MODEL, EP)
    assert parked is not None
    await d.dispatch(MODEL, EP, 10, [Pick("default", "alice", 9, 8.5)], 10)
    (again,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert again.job_id == parked.job_id and again.entry_id != first[parked.job_id].entry_id
    assert await x.start(again, "w1") == 1
    done = Outcome(JobState.COMPLETED, usage={"completion_tokens": 1}, finish_reason="stop")

    async def end(claimed: Claimed) -> int:
        pipe = x.pipeline()
        x.add_complete(pipe, claimed, done)
        (reply,) = await pipe.execute()
        return int(reply)

    assert await end(first[parked.job_id]) == 0  # stale: the job runs on
    assert await r.hget(keys.job(MODEL, parked.job_id), "st") == b"running"
    assert await end(again) == 1
    assert await r.hget(keys.job(MODEL, parked.job_id), "st") == b"completed"


async def test_an_answer_begun_after_a_fence_goes_on_from_its_token_ids(r: Redis) -> None:
    jobs, d = await _in_engine(r, "alice", 2)  # resume_streams "exact": ids needed
    parked = await d.park(MODEL, EP)
    assert parked is not None
    await d.dispatch(MODEL, EP, 10, [Pick("default", "alice", 9, 8.5)], 10)
    x = ExecutionStore(r, settings())
    await x.load_scripts()
    for job_id in jobs:  # the parked job's attempt writes after the fence 1-0
        again = job_id == parked.job_id
        trail = TokenTrail(b"7", b"1") if again else None  # the other's engine gave no ids
        pipe = x.pipeline()
        x.add_chunk(pipe, MODEL, job_id, b"1-2" if again else b"0-2", b"data: {}\n\n", trail=trail)
        x.add_first(pipe, MODEL, job_id)
        await pipe.execute()
    # Its first output entry, not the fence before it, holds the prompt's ids: it goes on.
    assert await d.park(MODEL, EP) == parked
    fences = [i for i, f in await r.xrange(keys.results(MODEL, parked.job_id)) if b"pk" in f]
    assert fences == [b"1-0", b"2-0"]


async def test_a_parked_job_can_be_cancelled_and_its_user_leaves_the_backlog(r: Redis) -> None:
    _, d = await _in_engine(r, "alice", 2)
    q = JobQueue(r, settings())
    parked = await d.park(MODEL, EP)
    assert parked is not None
    assert await r.zscore(keys.backlog(MODEL, "default"), "alice") is not None
    assert (await q.cancel(parked.job_id, "alice")).state is JobState.CANCELLED
    assert await r.zscore(keys.backlog(MODEL, "default"), "alice") is None
    assert await r.llen(keys.parked(MODEL, "default", "alice")) == 0
    assert await r.hget(keys.queued_counts(MODEL), "default") == b"0"


async def test_the_worker_that_ran_a_parked_job_cannot_complete_it(r: Redis) -> None:
    _, d = await _in_engine(r, "alice", 2)
    x = ExecutionStore(r, settings())
    claimed = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    for job in claimed:
        assert await x.start(job, "w1") == 1
    parked = await d.park(MODEL, EP)
    assert parked is not None
    late = next(job for job in claimed if job.job_id == parked.job_id)
    await x.load_scripts()
    pipe = x.pipeline()
    x.add_complete(pipe, late, Outcome(JobState.COMPLETED, usage={"completion_tokens": 1}))
    assert (await pipe.execute())[0] == 0  # refused: the job is queued again
    job = await JobQueue(r, settings()).get(parked.job_id, "alice")
    assert job.state is JobState.QUEUED
    assert await r.hget(keys.job(MODEL, parked.job_id), "att") == b"0"


async def test_a_streamed_job_with_output_stays_unless_its_token_ids_were_recorded(
    r: Redis,
) -> None:
    jobs, d = await _in_engine(r, "alice", 2)  # resume_streams "exact" by default
    await _sent_output(r, jobs)  # the engine gave no token ids
    assert await d.park(MODEL, EP) is None
    assert await r.hget(keys.job(MODEL, jobs[0]), "rsm") == b"1"


async def test_a_streamed_job_whose_token_ids_were_recorded_goes_on_from_them(
    r: Redis,
) -> None:
    jobs, d = await _in_engine(r, "alice", 2)
    trail = TokenTrail(b"7;8,9", b"1,2,3")
    x = await _sent_output(r, jobs, trail)
    parked = await d.park(MODEL, EP)
    assert parked is not None and parked.job_id == jobs[0]
    await d.dispatch(MODEL, EP, 10, [Pick("default", "alice", 9, 8.5)], 10)
    claimed = await x.claim(r, [MODEL], "w2", count=10, block_ms=100)
    assert all(job.track_tokens for job in claimed)  # the worker asks the engine for ids
    (resumed,) = [job for job in claimed if job.job_id == parked.job_id]
    assert await x.written(resumed) == [WrittenEntry(b"data: {}\n\n", trail)]


async def test_with_resume_streams_off_a_streamed_job_with_output_stays(r: Redis) -> None:
    off = settings(models=[{"name": MODEL, "endpoints": [EP], "resume_streams": "off"}])
    jobs, d = await _in_engine(r, "alice", 2, s=off)
    await _sent_output(r, jobs, TokenTrail(b"7", b"1"))
    assert await d.park(MODEL, EP) is None
    claimed = await ExecutionStore(r, off).claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert not any(job.track_tokens for job in claimed)
