"""A request's own queue deadline, ``X-Fairq-Max-Queue-S``, through the official ``openai``
client: while a flood keeps the engine busy, requests that may wait 1 s end 408
``job_expired`` (chat whole and streamed, a legacy completion), and the openai client, on
its default retries, does not queue them again; the request queued before them keeps its
place and the one behind them runs. Bad values are a 400 before anything is queued.

Real Redis, a slow simulated engine and the gateway under uvicorn, the dispatcher and a
worker (whose sweeper ends what is overdue) in the test's loop; the engine runs one
request at a time (``inflight_cap`` 1, static admission, no kept slot).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from broker import AsyncClient, keys
from sim import SimProfile
from tests.support.eventually import WAIT_S, aeventually
from tests.support.settings import ALICE_KEY, BOB_KEY, MODEL, make_settings
from tests.support.stack import components, sim
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

HEADER = "X-Fairq-Max-Queue-S"
BAND = "interactive"  # the keys' default band: its own deadline is 600 s
MESSAGES: Any = [{"role": "user", "content": "hi"}]
SLOW = SimProfile(step_base_ms=10.0, step_per_seq_ms=0.0, default_output_tokens=8)
FLOOD_TOKENS = 300  # ~3 s each: the first outlasts the 1 s deadlines by far
ONE_AT_A_TIME = {"inflight_cap": 1, "reserved_slots": 0, "preemption": False}


@pytest.fixture
async def url(redis_url: str) -> AsyncIterator[str]:
    with sim(SLOW) as engine:
        settings = make_settings(redis_url, [engine], quick=True, model_fields=ONE_AT_A_TIME)
        with gateway_server(settings) as served:
            async with components(settings):
                yield served


def client(url: str, key: str = BOB_KEY, **options: Any) -> openai.AsyncOpenAI:
    options = {"max_retries": 0, "timeout": WAIT_S, **options}
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, **options)


async def queued(redis: Redis, count: int) -> None:
    """Until bob has ``count`` jobs in his queue: each request is in line before the next."""
    length = await aeventually(
        lambda: redis.xlen(keys.queue(MODEL, BAND, "bob")), f"{count} queued", until=count.__eq__
    )
    assert length == count


async def refused(call: Awaitable[Any]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as raised:
        await call
    return raised.value


async def streamed(ai: openai.AsyncOpenAI, **fields: Any) -> list[Any]:
    stream = await ai.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True, **fields)
    return [chunk async for chunk in stream]


async def jobs_of(redis: Redis, user: str) -> list[dict[bytes, bytes]]:
    found = [await redis.hgetall(k) async for k in redis.scan_iter(match=keys.job_pattern(MODEL))]
    return [job for job in found if job.get(b"u") == user.encode()]


async def test_requests_that_may_wait_a_second_expire_behind_a_flood_and_the_next_one_runs(
    url: str, redis_url: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, quick=True)
    hurry = {"extra_headers": {HEADER: "1"}}
    async with AsyncClient(settings, api_key=ALICE_KEY) as alice, client(url) as bob:
        flood = [
            await alice.submit(MODEL, messages=MESSAGES, max_tokens=FLOOD_TOKENS) for _ in range(4)
        ]
        await aeventually(lambda: _running(aredis, flood[0]), "the flood to run")
        # The retries an openai client makes by default: x-should-retry: false stops them.
        async with client(url, max_retries=2) as retrying:
            kept = asyncio.create_task(
                bob.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
            )
            await queued(aredis, 1)
            hurried = [
                asyncio.create_task(refused(call))
                for call in (
                    retrying.chat.completions.create(
                        model=MODEL, messages=MESSAGES, max_tokens=2, **hurry
                    ),
                    streamed(retrying, max_tokens=2, **hurry),
                    retrying.completions.create(model=MODEL, prompt="hi", max_tokens=2, **hurry),
                )
            ]
            await queued(aredis, 4)
            behind = asyncio.create_task(
                bob.chat.completions.with_raw_response.create(
                    model=MODEL, messages=MESSAGES, max_tokens=2
                )
            )
            await queued(aredis, 5)
            errors = await asyncio.gather(*hurried)
            first_job_still_running = await _running(aredis, flood[0])
        answer, after = await kept, await behind
        for job_id in flood:
            await alice.cancel(job_id)
        bobs = await jobs_of(aredis, "bob")
    for error in errors:
        assert error.status_code == 408, error
        assert (error.type, error.code) == ("timeout", "job_expired")
        assert error.response.headers["x-should-retry"] == "false"
    assert first_job_still_running  # they expired behind the flood, not after it
    assert answer.choices[0].message.content and after.parse().usage.completion_tokens == 2
    # The one ahead kept its place: it went to the engine before the one behind.
    sent_ms = [
        await _dispatched_ms(aredis, answer.id),
        await _dispatched_ms(aredis, after.parse().id),
    ]
    assert sent_ms == sorted(sent_ms)
    states = sorted(job[b"st"].decode() for job in bobs)
    assert states == ["completed", "completed", "expired", "expired", "expired"]  # no retry
    expired = [job for job in bobs if job[b"st"] == b"expired"]
    assert all(b"td" not in job for job in expired)  # never dispatched: ended in the queue
    assert await aredis.zcard(keys.own_deadlines(MODEL, BAND)) == 0


async def test_a_retry_with_the_same_idempotency_key_keeps_the_first_tries_deadline(
    url: str, redis_url: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, quick=True)
    once = {"Idempotency-Key": "deadline-1"}
    async with AsyncClient(settings, api_key=ALICE_KEY) as alice, client(url) as bob:
        flood = [await alice.submit(MODEL, messages=MESSAGES, max_tokens=FLOOD_TOKENS)]
        await aeventually(lambda: _running(aredis, flood[0]), "the flood to run")
        create = bob.chat.completions.create
        first = await refused(
            create(model=MODEL, messages=MESSAGES, extra_headers={**once, HEADER: "1"})
        )
        # The header is not in the fingerprint: the same job, and its deadline, not a 409.
        again = await refused(
            create(model=MODEL, messages=MESSAGES, extra_headers={**once, HEADER: "30"})
        )
        await alice.cancel(flood[0])
    assert (
        (first.status_code, first.code) == (again.status_code, again.code) == (408, "job_expired")
    )
    assert again.response.headers["idempotent-replayed"] == "true"
    job_id = first.response.headers["x-fairq-job-id"]
    assert again.response.headers["x-fairq-job-id"] == job_id


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", "1e3", "604801"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_bad_value_is_a_400_that_says_what_to_send_and_queues_nothing(
    url: str, aredis: Redis, value: str, stream: bool
) -> None:
    async with client(url) as bob:
        error = await refused(
            bob.chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=stream, extra_headers={HEADER: value}
            )
        )
    assert isinstance(error, openai.BadRequestError)
    assert (error.type, error.code, error.param) == ("invalid_request_error",
                                                     "invalid_max_queue_s", None)  # fmt: skip
    assert f"{HEADER} must be a number of seconds above 0 and at most 604800" in error.message
    assert await jobs_of(aredis, "bob") == []


async def test_a_value_beyond_the_bands_deadline_is_clamped_to_it(
    redis_url: str, aredis: Redis
) -> None:
    # No dispatcher: both stay queued. The Python client's max_queue_s is the header's twin.
    settings = make_settings(redis_url, quick=True)
    async with AsyncClient(settings, api_key=BOB_KEY) as bob:
        await bob.submit(MODEL, messages=MESSAGES, max_queue_s=900)  # the band's 600 s holds
        shorter = await bob.submit(MODEL, messages=MESSAGES, max_queue_s=599)
    assert await aredis.zrange(keys.own_deadlines(MODEL, BAND), 0, -1) == [shorter.encode()]


async def _dispatched_ms(redis: Redis, answer_id: str) -> int:
    """When the job of an answer (``chatcmpl-<job id>``) went to the engine."""
    return int(await redis.hget(keys.job(MODEL, answer_id.removeprefix("chatcmpl-")), "td"))


async def _running(redis: Redis, job_id: str) -> bool:
    return await redis.hget(keys.job(MODEL, job_id), "st") == b"running"
