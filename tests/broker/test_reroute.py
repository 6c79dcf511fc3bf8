"""reroute.lua's contract, against a real Redis and fakeredis: a worker hands back a job its
engine never took; the job goes to the head of its user's line, keeps its id and its result
stream behind a fence, and is dispatched again, a bounded number of times."""

from __future__ import annotations

from dataclasses import replace

from redis.asyncio import Redis

from broker import (
    Claimed,
    DispatchStore,
    ExecutionStore,
    JobQueue,
    JobState,
    Outcome,
    Pick,
    Reroute,
    Settings,
    keys,
)
from tests.support.contract import EP, MODEL, settings, submission

OTHER = "http://127.0.0.1:10"


async def _running(r: Redis, s: Settings, user: str = "alice", n: int = 1) -> list[Claimed]:
    """``n`` jobs of ``user`` dispatched to EP and started by worker w1."""
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    for _ in range(n):
        await q.submit(submission(user))
    await d.dispatch(MODEL, EP, 10, [Pick("default", user, i + 1, i) for i in range(n)], 10)
    claimed = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert [await x.start(job, "w1") for job in claimed] == [1] * n
    return claimed


async def _claim(r: Redis, x: ExecutionStore, worker: str) -> list[Claimed]:
    return await x.claim(r, [MODEL], worker, count=10, block_ms=100)


async def test_a_job_handed_back_leaves_its_endpoint_and_heads_its_users_line(r: Redis) -> None:
    s = settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    (job,) = await _running(r, s)
    later = await q.submit(submission("alice"))  # queued behind what comes back
    handed = await x.reroute(job)
    assert (handed.outcome, handed.times) == (Reroute.REROUTED, 1)
    h = keys.job(MODEL, job.job_id)
    assert (await q.get(job.job_id, "alice")).state is JobState.QUEUED
    assert await r.hmget(h, "wk", "att", "rr", "rsq", "pk") == [b"-", b"0", b"1", b"1", b"1"]
    assert await r.hget(h, "ep") is None and await r.hget(h, "ft") is None
    # Its endpoint's counts fell, and its ready entry is gone (acked and deleted).
    snap = await d.snapshot(MODEL, 10, in_engine=True)
    assert snap.inflight.get(EP, 0) == 0 and snap.unstarted.get(EP, 0) == 0
    assert snap.in_engine == {"alice": 0}  # backlogged again, with nothing in the engine
    assert await r.xlen(keys.ready(MODEL)) == 0
    assert (await r.xpending(keys.ready(MODEL), keys.READY_GROUP))["pending"] == 0
    # Its result stream holds the fence only: no output, nothing for its client twice.
    assert [f for _, f in await r.xrange(keys.results(MODEL, job.job_id))] == [{b"pk": b"1"}]
    # Dispatched again, to another endpoint, before the job queued after it, with its
    # payload; the attempt writes after the fence and starts afresh.
    ids, _, _ = await d.dispatch(MODEL, OTHER, 10, [Pick("default", "alice", 9, 8)], 10)
    assert ids == [job.job_id]
    (again,) = await _claim(r, x, "w2")
    assert again.endpoint == OTHER and again.payload == job.payload
    assert again.resume_gen == 1 and await x.written(again) == []
    assert await x.start(again, "w2") == 1  # the start handed back is not counted
    assert (await q.get(later, "alice")).state is JobState.QUEUED


async def test_a_late_write_of_the_attempt_handed_back_is_refused(r: Redis) -> None:
    s = settings()
    x = ExecutionStore(r, s)
    await x.load_scripts()
    (job,) = await _running(r, s)
    assert (await x.reroute(job)).outcome is Reroute.REROUTED
    # A chunk and a started mark of the old attempt, still on their way: the chunk is
    # refused by the fence, the mark leaves the queued job alone (its next attempt's
    # unstarted count must fall at that attempt's own first output).
    pipe = x.pipeline()
    x.add_chunk(pipe, MODEL, job.job_id, b"0-2", b"data: {}\n\n")
    x.add_first(pipe, MODEL, job.job_id)
    chunk, first = await pipe.execute(raise_on_error=False)
    assert x.is_duplicate_write(chunk) and first == 0
    assert await r.hget(keys.job(MODEL, job.job_id), "ft") is None
    d = DispatchStore(r, s)
    await d.dispatch(MODEL, OTHER, 10, [Pick("default", "alice", 9, 8)], 10)
    (again,) = await _claim(r, x, "w2")
    assert await x.start(again, "w2") == 1
    pipe = x.pipeline()
    x.add_first(pipe, MODEL, job.job_id)
    assert await pipe.execute() == [1]
    assert (await d.snapshot(MODEL, 1)).unstarted.get(OTHER, 0) == 0


async def test_past_the_bound_a_job_is_left_running_for_its_worker_to_fail(r: Redis) -> None:
    s = settings(engine_max_reroutes=2)
    d, x = DispatchStore(r, s), ExecutionStore(r, s)
    (job,) = await _running(r, s)
    for times in (1, 2):
        assert await x.reroute(job) == (Reroute.REROUTED, times)
        await d.dispatch(MODEL, EP, 10, [Pick("default", "alice", 9, 8)], 10)
        (job,) = await _claim(r, x, f"w{times + 1}")
        assert await x.start(job, job.worker) == 1
    assert await x.reroute(job) == (Reroute.EXHAUSTED, 2)
    h = keys.job(MODEL, job.job_id)
    assert await r.hmget(h, "st", "wk", "ep") == [b"running", b"w3", EP.encode()]
    # The worker ends it failed, as any job: its entry goes with it.
    pipe = x.pipeline()
    x.add_complete(pipe, job, Outcome(JobState.FAILED, error={"code": "engine_unavailable"}))
    assert await pipe.execute() == [1]
    assert (await d.snapshot(MODEL, 1)).inflight.get(EP, 0) == 0


async def test_a_job_with_output_is_not_handed_back(r: Redis) -> None:
    s = settings()
    x = ExecutionStore(r, s)
    (job,) = await _running(r, s)
    pipe = x.pipeline()
    x.add_chunk(pipe, MODEL, job.job_id, x.entry_id(job, 1), b"data: {}\n\n")
    await pipe.execute()
    assert (await x.reroute(job)).outcome is Reroute.OUTPUT
    assert await r.hget(keys.job(MODEL, job.job_id), "st") == b"running"


async def test_an_attempt_that_is_not_its_workers_any_more_is_left_alone(r: Redis) -> None:
    s = settings()
    q, x = JobQueue(r, s), ExecutionStore(r, s)
    first, second = await _running(r, s, n=2)
    # Another worker's (its lease lapsed and it was taken over), another attempt's (taken
    # back and dispatched again), or ended (cancelled).
    assert (await x.reroute(replace(first, worker="w9"))).outcome is Reroute.STALE
    assert (await x.reroute(replace(first, entry_id=b"1-1"))).outcome is Reroute.STALE
    await q.cancel(second.job_id, "alice")
    assert (await x.reroute(second)).outcome is Reroute.STALE
    assert await r.hget(keys.job(MODEL, first.job_id), "st") == b"running"
    assert (await q.get(second.job_id, "alice")).state is JobState.CANCELLED
