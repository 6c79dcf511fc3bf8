"""Quotas through the official ``openai`` client: OpenAI's ``x-ratelimit-*`` headers on the
answers to a key with a quota (whole and streamed), and the 429 ``rate_limit_exceeded``
past a limit with the ``Retry-After`` the client acts on: it waits that long and retries
while it is at most 2 minutes (a minute's limit), raises at once when it is longer (a
day's), and never retries a request that passes a limit alone (``x-should-retry:
false``). Real Redis, the simulator and the gateway under uvicorn, the dispatcher and a
worker in the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
from redis.asyncio import Redis

from broker import keys
from tests.support.eventually import WAIT_S, aeventually
from tests.support.quota import day_left_s, redis_now_ms, within_one_minute
from tests.support.settings import ALICE_KEY, BOB_KEY, MODEL, make_settings
from tests.support.stack import components, sim
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

MESSAGES: Any = [{"role": "user", "content": "hi"}]
MAX_TOKENS = 4
ESTIMATE = len(orjson.dumps(MESSAGES)) // 4 + MAX_TOKENS  # what a request is charged first
_RESET = re.compile(r"^(\d+h)?(\d+m)?\d+(\.\d+)?s$|^\d+ms$")


@contextlib.asynccontextmanager
async def served(redis_url: str, **limits: int) -> AsyncIterator[str]:
    """A stack whose key of alice has a quota of ``limits`` (bob's has none)."""
    with sim() as engine:
        quota = {"user": "alice", **limits}
        settings = make_settings(redis_url, [engine], quick=True, quotas=[quota])
        with gateway_server(settings) as url:
            async with components(settings):
                yield url


def client(url: str, key: str = ALICE_KEY, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, timeout=WAIT_S, **options)


async def ask(ai: openai.AsyncOpenAI, **fields: Any) -> Any:
    return await ai.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, **fields
    )


async def test_every_answer_to_a_key_with_a_quota_says_where_it_stands(
    redis_url: str, aredis: Redis
) -> None:
    await within_one_minute(aredis, room_s=10)
    async with served(redis_url, tokens_per_minute=1000, requests_per_minute=50) as url:
        async with client(url, max_retries=0) as ai:
            raw = await ai.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS
            )
            used = raw.parse().usage
            stream = await ask(ai, stream=True)
            _ = [chunk async for chunk in stream]
        async with client(url, key=BOB_KEY, max_retries=0) as ai:
            bobs = await ai.chat.completions.with_raw_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS
            )
    assert used is not None
    first, streamed = raw.headers, stream.response.headers
    assert first["x-ratelimit-limit-tokens"] == "1000"
    assert first["x-ratelimit-remaining-tokens"] == str(1000 - ESTIMATE)
    assert first["x-ratelimit-limit-requests"] == "50"
    assert first["x-ratelimit-remaining-requests"] == "49"
    assert _RESET.match(first["x-ratelimit-reset-tokens"]), first["x-ratelimit-reset-tokens"]
    # The first job ended before the stream was queued: its charge is its usage now.
    assert streamed["x-ratelimit-remaining-tokens"] == str(1000 - used.total_tokens - ESTIMATE)
    assert streamed["x-ratelimit-remaining-requests"] == "48"
    assert not [name for name in bobs.headers if name.startswith("x-ratelimit")]
    quota = await aredis.hgetall(keys.user_quota("alice"))
    assert int(quota[b"mr"]) == 2


async def test_past_a_minutes_limit_the_client_is_told_when_it_may_try_again(
    redis_url: str, aredis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await within_one_minute(aredis, room_s=10)
    async with served(redis_url, tokens_per_minute=ESTIMATE) as url:
        async with client(url, max_retries=0) as ai:
            await ask(ai)  # the whole minute's tokens, estimated (its usage is a little less)
            with pytest.raises(openai.RateLimitError) as refused:
                await ask(ai, stream=True)
        error, headers = refused.value, refused.value.response.headers
        assert error.code == "rate_limit_exceeded" and error.type == "tokens"
        assert f"user 'alice' on tokens per min: Limit {ESTIMATE}" in error.message
        retry_after_ms = int(headers["retry-after-ms"])
        assert 0 < retry_after_ms <= 60_000
        assert int(headers["retry-after"]) == -(-retry_after_ms // 1000)
        assert headers["x-ratelimit-limit-tokens"] == str(ESTIMATE)
        assert "x-should-retry" not in headers
        # The client's own retries (2 by default) wait out the Retry-After: it logs the
        # wait it took from the header, and the test leaves it there.
        caplog.set_level(logging.INFO, logger="openai")
        async with client(url) as ai:
            waiting = asyncio.create_task(ask(ai))
            line = await aeventually(lambda: _retry_wait(caplog), "the client's retry wait")
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
    assert abs(line - retry_after_ms / 1000) < 2.0


def _retry_wait(caplog: pytest.LogCaptureFixture) -> float | None:
    """The wait the openai client logged before its first retry, in seconds."""
    for record in caplog.records:
        found = re.match(r"Retrying request in ([\d.]+) seconds", record.getMessage())
        if found:
            return float(found.group(1))
    return None


async def test_past_a_days_limit_the_client_gives_up_at_once(
    redis_url: str, aredis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    if day_left_s(await redis_now_ms(aredis)) <= 130:  # the client would wait for the day
        pytest.skip("the UTC day ends within the 2 minutes the openai client waits at most")
    caplog.set_level(logging.INFO, logger="openai")
    async with served(redis_url, tokens_per_day=ESTIMATE) as url, client(url) as ai:
        await ask(ai)  # the client has its default retries
        started = time.monotonic()
        with pytest.raises(openai.RateLimitError) as refused:
            await ask(ai)
    assert int(refused.value.response.headers["retry-after"]) > 120  # more than it waits
    assert time.monotonic() - started < 5 and _retry_wait(caplog) is None


async def test_a_request_too_large_for_a_limit_is_never_retried(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="openai")
    async with served(redis_url, tokens_per_minute=ESTIMATE - 1) as url, client(url) as ai:
        with pytest.raises(openai.RateLimitError) as refused:
            await ask(ai)
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert "Request too large for user 'alice'" in refused.value.message
    assert _retry_wait(caplog) is None
