"""The whole path with real processes: Python client → Redis → dispatcher → worker → simulator.

Each component runs as its own ``fairq`` process against the session's real
Redis; the simulator stands in for vLLM.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from broker import Client, JobFailed, JobState, Settings, keys
from fairq.stack.processes import Stack
from tests.support.eventually import eventually
from tests.support.settings import make_settings
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

KEY_A, KEY_B = "fq-demo-alice", "fq-demo-bob"
MODEL = "demo-chat"


@pytest.fixture
def stack(redis_url: str) -> Iterator[Stack]:
    with demo_stack(
        per_model={MODEL: {"inflight_cap": 2}}, redis_url=redis_url, gateway=False
    ) as running:
        yield running


@pytest.fixture
def settings(stack: Stack) -> Settings:
    return make_settings(stack.redis_url, **stack.config)


def test_python_client_streams_and_completes_through_real_processes(settings: Settings) -> None:
    with Client(settings, api_key=KEY_A) as client:
        job_id = client.submit(MODEL, messages=[{"role": "user", "content": "hi"}],
                               stream=True, max_tokens=5)  # fmt: skip
        chunks = list(client.stream(job_id))
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert len(chunks) == 6 and text  # role chunk + 5 tokens
        assert chunks[0]["id"] == f"chatcmpl-{job_id}"
        assert not any("usage" in c for c in chunks)  # not asked for, so not passed on
        job = client.status(job_id)
        assert job.state is JobState.COMPLETED and job.finish_reason == "length"
        assert job.usage is not None and job.usage["completion_tokens"] == 5
        assert job.first_token_ms is not None and job.ended_ms is not None

        plain = client.submit(MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        body = client.result(plain)
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 3


def test_engine_rejection_fails_the_job_with_the_engines_reason(settings: Settings) -> None:
    with Client(settings, api_key=KEY_A) as client:
        job_id = client.submit(MODEL, prompt="x", max_tokens=10**6)
        with pytest.raises(JobFailed) as info:
            client.result(job_id)
        assert info.value.status == 400 and "engine rejected" in info.value.message
        assert client.status(job_id).state is JobState.FAILED


def test_round_robin_serves_a_newcomer_before_the_power_users_next_jobs(
    settings: Settings, redis_url: str
) -> None:
    prompt = [{"role": "user", "content": "hello"}]
    with Client(settings, api_key=KEY_A) as alice, Client(settings, api_key=KEY_B) as bob:
        a_jobs = [alice.submit(MODEL, messages=prompt, max_tokens=8) for _ in range(200)]
        b_job = bob.submit(MODEL, messages=prompt, max_tokens=8)
        for job_id in [*a_jobs[:3], b_job]:
            alice_or_bob = bob if job_id == b_job else alice
            alice_or_bob.result(job_id)
        for job_id in a_jobs[3:]:
            alice.cancel(job_id)
    r = redis.Redis.from_url(redis_url)
    # The dispatch order is the order of the jobs' ready-stream entry ids ("re").
    fields = {j: r.hmget(keys.job(MODEL, j), "re", "td") for j in [*a_jobs, b_job]}
    order = sorted((j for j, (re, _) in fields.items() if re), key=lambda j: _entry(fields[j][0]))
    b_enqueued = int(r.hget(keys.job(MODEL, b_job), "tq"))
    dispatched_ms = {j: int(fields[j][1]) for j in order}
    after_b = [j for j in order if dispatched_ms[j] > b_enqueued]
    # B is dispatched at the first free slot after it arrived, or the one after if a
    # dispatch raced its arrival; never behind a run of A's jobs.
    assert b_job in after_b[:2], f"B dispatched at position {order.index(b_job)} of {len(order)}"
    assert order.index(b_job) < 40, "the test should catch B while A still has a long backlog"
    cancelled = sum(r.hget(keys.job(MODEL, j), "st") == b"cancelled" for j in a_jobs)
    assert cancelled > 100  # A's backlog was still long when B went through
    r.close()


def _entry(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq)


def _wait_for_grant(r: redis.Redis, credits: int, sequence_above: int = -1) -> int:
    """Wait until the dispatcher has granted ``credits`` express sends of the default band
    past a sequence (10 s at most); returns the grant's sequence."""
    field = keys.grant_field("default").encode()

    def granted(meta: dict[bytes, bytes]) -> bool:
        sequence = int(meta.get(b"xs", b"0"))
        return bool(meta.get(b"xep")) and sequence > sequence_above and int(meta[field]) == credits

    meta = eventually(
        lambda: r.hgetall(keys.meta(MODEL)),
        f"an express grant of {credits}",
        10,
        until=granted,
        interval_s=0.05,
    )
    return int(meta.get(b"xs", b"0"))


def test_a_job_for_an_idle_model_skips_the_dispatcher_hop_within_its_admission(
    settings: Settings, redis_url: str
) -> None:
    r = redis.Redis.from_url(redis_url)
    target = 3  # the demo model's queue target: an idle engine takes a burst of 3
    sequence = _wait_for_grant(r, target)
    prompt = [{"role": "user", "content": "hello"}]
    with Client(settings, api_key=KEY_A) as alice:
        jobs = [alice.submit(MODEL, messages=prompt, max_tokens=400) for _ in range(target + 1)]
        # Sent by enqueue.lua itself, up to the admission's room, so never in a user queue
        # ("qe"); the next one was queued for the dispatcher. Her first goes at once; her
        # next ones, a user's already in the engine, within the room the grant leaves them
        # (while the engine's capacity is learned, one place of the target stays for a
        # newcomer, and the dispatcher may renew the grant between her sends).
        queued = [r.hget(keys.job(MODEL, j), "qe") is not None for j in jobs]
        express = queued.index(True)
        assert 1 <= express <= target and all(queued[express:]), queued
        for job_id in jobs:
            alice.cancel(job_id)
    # Once the jobs have ended and freed their room, the dispatcher grants a burst again.
    _wait_for_grant(r, target, sequence_above=sequence + express - 1)
    r.close()
