"""Quotas in Redis (``broker.quotas``): enqueue.lua charges a job to its tenant's and user's
counters or refuses it, in the call that queues it; prelude.lua's finish settles the
charge at the job's end (complete, cancel, expire), exactly once. Driven through the
public stores against a real Redis and fakeredis, like the broker contract suite."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import (
    DispatchStore,
    ExecutionStore,
    JobQueue,
    JobState,
    Outcome,
    OverQuota,
    Pick,
    QueueFull,
    Settings,
    Submission,
    keys,
)
from broker.idempotency import Idempotency, fingerprint
from broker.lua.enqueue import Route
from broker.quotas import DAY_MS, MINUTE_MS, Counts
from tests.support.contract import EP, MODEL, settings, submission
from tests.support.quota import within_one_minute
from tests.support.settings import api_key

ALICE_QUOTA = keys.tenant_quota("alice")  # alice is her own tenant in the default keys
LIMITS = {"tokens_per_minute": 100, "tokens_per_day": 1000, "requests_per_minute": 5}


def quota_settings(*quotas: dict[str, Any], **overrides: Any) -> Settings:
    return settings(quotas=list(quotas) or [{"tenant": "alice", **LIMITS}], **overrides)


def asking(tokens: int, user: str = "alice", **fields: Any) -> Submission:
    return replace(submission(user), tokens=tokens, **fields)


async def counters(r: Redis, key: str = ALICE_QUOTA) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await r.hgetall(key)).items()}


async def run_to_end(r: Redis, s: Settings, outcome: Outcome, *, output: bool = False) -> None:
    """Dispatch alice's queued job, start it, (write its first output), and end it."""
    d, x = DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)
    (claimed,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    assert await x.start(claimed, "w1") == 1
    await x.load_scripts()
    pipe = x.pipeline()
    if output:
        x.add_chunk(pipe, MODEL, claimed.job_id, x.entry_id(claimed, 1), b"data: {}\n\n")
        x.add_first(pipe, MODEL, claimed.job_id)
    x.add_complete(pipe, claimed, outcome)
    await pipe.execute()


async def test_a_job_is_charged_its_estimate_and_a_request_in_its_minute_and_day(
    r: Redis,
) -> None:
    await within_one_minute(r)
    q = JobQueue(r, quota_settings())
    submitted = await q.submit_job(asking(30))
    assert submitted.quota is not None
    ((quota, counts),) = submitted.quota.quotas
    assert quota.key == ALICE_QUOTA and counts == Counts(30, 30, 1, 1)
    now = submitted.quota.now_ms
    assert await counters(r) == {
        "mi": now // MINUTE_MS, "mt": 30, "mr": 1, "di": now // DAY_MS, "dt": 30, "dr": 1
    }  # fmt: skip
    # The counters last to the end of the next UTC day.
    assert abs(await r.pttl(ALICE_QUOTA) - ((now // DAY_MS + 2) * DAY_MS - now)) < 5000
    job = await r.hgetall(keys.job(MODEL, submitted.job_id))
    assert job[b"qc"] == b"30" and job[b"q1"] == ALICE_QUOTA.encode() and b"q2" not in job


async def test_a_request_that_would_pass_a_limit_is_refused_and_changes_nothing(
    r: Redis,
) -> None:
    await within_one_minute(r)
    q = JobQueue(r, quota_settings())
    await q.submit(asking(60))
    with pytest.raises(OverQuota) as refused:
        await q.submit(asking(60))
    error = refused.value
    assert error.status == 429 and error.code == "rate_limit_exceeded" and error.type == "tokens"
    assert "tenant 'alice' on tokens per min: Limit 100, Used 60, Requested 60" in error.message
    assert not error.final and 0 < error.retry_after_ms <= MINUTE_MS
    assert error.quota.quotas[0][1] == Counts(60, 60, 1, 1)  # as it stands: nothing charged
    assert (await counters(r))["mt"] == 60 and (await counters(r))["mr"] == 1
    assert await r.xlen(keys.queue(MODEL, "default", "alice")) == 1
    assert len([k async for k in r.scan_iter(match=keys.job_pattern(MODEL))]) == 1
    await q.submit(asking(40))  # what fits still passes: 100 of 100


async def test_a_request_the_limit_alone_cannot_hold_is_refused_for_good(r: Redis) -> None:
    q = JobQueue(r, quota_settings())
    with pytest.raises(OverQuota) as refused:
        await q.submit(asking(101))
    assert refused.value.final and "Request too large" in refused.value.message


async def test_the_request_past_requests_per_minute_is_refused(r: Redis) -> None:
    await within_one_minute(r)
    q = JobQueue(r, quota_settings({"tenant": "alice", "requests_per_minute": 2}))
    await q.submit(asking(1))
    await q.submit(asking(1))
    with pytest.raises(OverQuota) as refused:
        await q.submit(asking(1))
    assert refused.value.type == "requests"
    assert "on requests per min: Limit 2, Used 2, Requested 1" in refused.value.message


async def test_a_completed_job_is_corrected_to_its_usage(r: Redis) -> None:
    await within_one_minute(r)
    s = quota_settings()
    await JobQueue(r, s).submit(asking(80))
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    await run_to_end(r, s, Outcome(JobState.COMPLETED, usage=usage), output=True)
    c = await counters(r)
    assert (c["mt"], c["dt"], c["mr"], c["dr"]) == (15, 15, 1, 1)


async def test_a_job_that_never_produced_output_is_refunded_with_its_request(
    r: Redis,
) -> None:
    await within_one_minute(r)
    s = quota_settings()
    q = JobQueue(r, s)
    cancelled = await q.submit(asking(20))
    await q.cancel(cancelled, "alice")  # queued
    assert await counters(r) | {"mi": 0, "di": 0} == {
        "mi": 0, "mt": 0, "mr": 0, "di": 0, "dt": 0, "dr": 0
    }  # fmt: skip
    await q.submit(asking(20))  # a worker runs it, and it fails before any output
    await run_to_end(r, s, Outcome(JobState.FAILED, error={"message": "engine down"}))
    c = await counters(r)
    assert (c["mt"], c["mr"], c["dt"], c["dr"]) == (0, 0, 0, 0)


async def test_a_job_that_expired_in_the_queue_is_refunded(r: Redis) -> None:
    await within_one_minute(r)
    s = quota_settings()
    q, x = JobQueue(r, s), ExecutionStore(r, s)
    job_id = await q.submit(asking(20, max_queue_ms=30))
    await asyncio.sleep(0.06)
    assert await x.expire(MODEL, "default", None) == [job_id]
    c = await counters(r)
    assert (c["mt"], c["mr"], c["dt"], c["dr"]) == (0, 0, 0, 0)


async def test_a_job_cancelled_after_its_output_began_keeps_its_estimate(r: Redis) -> None:
    await within_one_minute(r)
    s = quota_settings()
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    job_id = await q.submit(asking(30))
    await d.dispatch(MODEL, EP, 4, [Pick("default", "alice", 1, 0.5)], 10)
    (claimed,) = await x.claim(r, [MODEL], "w1", count=10, block_ms=100)
    await x.start(claimed, "w1")
    await x.load_scripts()
    pipe = x.pipeline()
    x.add_chunk(pipe, MODEL, job_id, x.entry_id(claimed, 1), b"data: {}\n\n")
    x.add_first(pipe, MODEL, job_id)
    await pipe.execute()
    await q.cancel(job_id, "alice")  # its usage is never known: what it may have used stays
    c = await counters(r)
    assert (c["mt"], c["mr"], c["dt"], c["dr"]) == (30, 1, 30, 1)


async def test_a_passed_minute_counts_nothing_and_the_next_charge_starts_the_new_one(
    r: Redis,
) -> None:
    now = await within_one_minute(r)
    q = JobQueue(r, quota_settings())
    await r.hset(ALICE_QUOTA, mapping={"mi": now // MINUTE_MS - 1, "mt": 100, "mr": 5})
    await r.hset(ALICE_QUOTA, mapping={"di": now // DAY_MS, "dt": 900, "dr": 5})
    submitted = await q.submit_job(asking(30))  # the full minute has passed
    assert submitted.quota is not None
    assert submitted.quota.quotas[0][1] == Counts(30, 930, 1, 6)
    with pytest.raises(OverQuota) as refused:
        await q.submit(asking(71))  # 30 + 71 > 100 this minute
    assert refused.value.quota.quotas[0][1] == Counts(30, 930, 1, 6)


async def test_a_job_that_ends_after_its_minute_passed_corrects_its_day_alone(
    r: Redis,
) -> None:
    now = await within_one_minute(r)
    s = quota_settings()
    await JobQueue(r, s).submit(asking(50))
    # A later minute began meanwhile (another job started it): it is not this job's.
    await r.hset(ALICE_QUOTA, mapping={"mi": now // MINUTE_MS + 1, "mt": 7, "mr": 1})
    usage = {"prompt_tokens": 4, "completion_tokens": 6}
    await run_to_end(r, s, Outcome(JobState.COMPLETED, usage=usage), output=True)
    c = await counters(r)
    assert (c["mt"], c["mr"], c["dt"], c["dr"]) == (7, 1, 10, 1)


async def test_a_tenants_and_a_users_quota_both_count_and_the_tighter_one_refuses(
    r: Redis,
) -> None:
    await within_one_minute(r)
    s = quota_settings(
        {"tenant": "lab", "tokens_per_minute": 1000},
        {"user": "alice", "tokens_per_minute": 50},
        api_keys=[api_key("k-alice", "alice", tenant="lab"), api_key("k-bob", "bob", tenant="lab")],
    )
    q = JobQueue(r, s)
    submitted = await q.submit_job(asking(40, tenant="lab"))
    assert submitted.quota is not None
    assert [quota.key for quota, _ in submitted.quota.quotas] == [
        keys.tenant_quota("lab"), keys.user_quota("alice")
    ]  # fmt: skip
    with pytest.raises(OverQuota) as refused:
        await q.submit(asking(40, tenant="lab"))
    assert "user 'alice'" in refused.value.message
    await q.submit(asking(40, user="bob", tenant="lab"))  # bob has only the lab's
    assert (await counters(r, keys.tenant_quota("lab")))["mt"] == 80
    assert (await counters(r, keys.user_quota("alice")))["mt"] == 40


async def test_a_batch_line_is_never_refused_and_is_charged_its_usage_as_it_ends(
    r: Redis,
) -> None:
    await within_one_minute(r)
    s = quota_settings({"tenant": "alice", "tokens_per_minute": 10, "tokens_per_day": 10})
    q = JobQueue(r, s)
    line = asking(0)
    enqueued = await q.enqueue_call(line, "bTE.line-1", 10, keep_s=60).run(r)
    assert enqueued.route is Route.QUEUED  # over both limits' estimate: a batch line passes
    assert await counters(r) == {}  # nothing charged yet
    usage = {"prompt_tokens": 30, "completion_tokens": 20}
    await run_to_end(r, s, Outcome(JobState.COMPLETED, usage=usage), output=True)
    assert (await counters(r))["dt"] == 50 and (await counters(r))["dr"] == 1
    assert "mt" not in await counters(r)  # the day's limits alone count batches
    with pytest.raises(OverQuota):  # ... and hold back the tenant's requests today
        await q.submit(asking(1))


async def test_a_request_replayed_by_its_idempotency_key_is_charged_once(r: Redis) -> None:
    await within_one_minute(r)
    q = JobQueue(r, quota_settings())
    once = Idempotency(
        owner="alice", route="chat", key_digest="d1", fingerprint=fingerprint("chat", {}),
        window_s=60,
    )  # fmt: skip
    first = await q.submit_job(asking(30, once=once))
    again = await q.submit_job(asking(30, once=once))
    assert again.replayed and again.job_id == first.job_id
    assert again.quota is not None and again.quota.quotas[0][1] == Counts(30, 30, 1, 1)
    assert (await counters(r))["mt"] == 30


def test_a_key_without_a_quota_queues_in_the_same_one_call_with_nothing_added() -> None:
    """The hot path: no quota, no quota keys nor arguments (nor a second round trip)."""
    plain, quoted = JobQueue(None, settings()), JobQueue(None, quota_settings())  # type: ignore[arg-type]
    base = plain.enqueue_call(asking(30), "bTE.x", 10)
    bobs = quoted.enqueue_call(asking(30, user="bob"), "bTE.x", 10)  # bob has no quota
    assert len(base.keys) == len(bobs.keys) == 11 and len(base.args) == len(bobs.args)
    assert base.decode is bobs.decode
    charged = quoted.enqueue_call(asking(30), "bTE.x", 10)
    assert charged.keys[-1] == ALICE_QUOTA and len(charged.keys) == 12


async def test_a_request_refused_by_a_full_queue_is_not_charged_and_says_the_quota(
    r: Redis,
) -> None:
    await within_one_minute(r)
    q = JobQueue(r, quota_settings(max_queued_per_user=1))
    await q.submit(asking(30))
    with pytest.raises(QueueFull) as refused:
        await q.submit(asking(30))
    assert refused.value.quota is not None
    assert refused.value.quota.quotas[0][1] == Counts(30, 30, 1, 1)
    assert (await counters(r))["mt"] == 30
