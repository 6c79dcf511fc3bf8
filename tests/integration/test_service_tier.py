"""OpenAI's ``service_tier`` through the official ``openai`` client: the band a request
queues in, and the tier every response says it was served in (the whole body, each
streamed chunk). Real Redis, the simulator and the gateway under uvicorn, the dispatcher
and a worker in the test's loop; the band is read from the job's record."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from redis.asyncio import Redis

from tests.support.eventually import WAIT_S
from tests.support.settings import ALICE_KEY, MODEL, api_key, make_settings
from tests.support.stack import components, job_field, sim
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

CAROL, DAVE, ERIN = "k-carol", "k-dave", "k-erin"
KEYS = [
    api_key(ALICE_KEY, "alice"),  # every band, interactive its default
    api_key(CAROL, "carol", bands=["default", "interactive", "batch"]),
    api_key(DAVE, "dave", bands=["default", "batch"]),  # not the top band
    api_key(ERIN, "erin", bands=["interactive", "default"]),  # not batch
]
MESSAGES: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def url(redis_url: str) -> AsyncIterator[str]:
    """The gateway of a stack whose worker and dispatcher run in the test's loop."""
    with sim() as engine:
        settings = make_settings(redis_url, [engine], quick=True, api_keys=KEYS)
        with gateway_server(settings) as served:
            async with components(settings):
                yield served


def client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=WAIT_S)


async def whole(url: str, key: str, **fields: Any) -> tuple[str | None, str]:
    """The tier a whole chat answer says, and the job's id."""
    async with client(url, key) as ai:
        raw = await ai.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, **fields
        )
    return raw.parse().service_tier, raw.headers["x-fairq-job-id"]


# key, service_tier asked, band it runs in, tier the answer says
CASES = [
    (CAROL, None, "default", "default"),
    (CAROL, "auto", "default", "default"),
    (CAROL, "priority", "interactive", "priority"),
    (CAROL, "flex", "batch", "flex"),
    (ALICE_KEY, None, "interactive", "priority"),  # as it was served: in the top band
    (DAVE, "priority", "default", "default"),  # may not use the top band: its highest
    (ERIN, "flex", "default", "default"),  # may not use batch: its lowest
]


async def test_a_whole_answer_says_the_tier_of_the_band_it_ran_in(url: str, aredis: Redis) -> None:
    seen = []
    for key, tier, _band, _said in CASES:
        fields = {} if tier is None else {"service_tier": tier}
        said, job_id = await whole(url, key, **fields)
        seen.append((key, tier, await job_field(aredis, job_id, "b"), said))
    assert seen == CASES


async def test_a_body_the_engine_sends_whole_says_the_tier_not_the_engines_null(url: str) -> None:
    # A field the worker's rebuild does not cover: the engine answers whole (StreamMode.PLAIN),
    # with vLLM's "service_tier": null, which the worker replaces.
    said, _ = await whole(url, DAVE, service_tier="flex", logprobs=False)
    assert said == "flex"


async def test_every_streamed_chunk_says_the_tier(url: str) -> None:
    async with client(url, CAROL) as ai:
        stream = await ai.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=5, stream=True,
            stream_options={"include_usage": True}, service_tier="priority",
        )  # fmt: skip
        chunks = [chunk async for chunk in stream]
    assert len(chunks) == 1 + 5 + 1  # the role chunk, the tokens, the usage chunk
    assert chunks[-1].usage is not None
    assert {chunk.service_tier for chunk in chunks} == {"priority"}


async def test_a_legacy_completion_says_its_tier_too(url: str, aredis: Redis) -> None:
    async with client(url, CAROL) as ai:
        raw = await ai.completions.with_raw_response.create(
            model=MODEL, prompt="hi", max_tokens=2, extra_body={"service_tier": "flex"}
        )
    assert raw.parse().to_dict()["service_tier"] == "flex"
    assert await job_field(aredis, raw.headers["x-fairq-job-id"], "b") == "batch"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unknown_tier_is_a_400_naming_the_accepted_ones(url: str, stream: bool) -> None:
    async with client(url, CAROL) as ai:
        with pytest.raises(openai.BadRequestError) as raised:
            await ai.chat.completions.create(
                model=MODEL, messages=MESSAGES, stream=stream, service_tier="scale"
            )
    error = raised.value
    assert (error.status_code, error.type, error.param) == (400, "invalid_request_error",
                                                            "service_tier")  # fmt: skip
    assert "'priority', 'default', 'auto', 'flex'" in error.message


async def test_the_band_header_wins_over_the_tier(url: str, aredis: Redis) -> None:
    said, job_id = await whole(
        url, CAROL, service_tier="priority", extra_headers={"X-Fairq-Band": "batch"}
    )
    assert (said, await job_field(aredis, job_id, "b")) == ("flex", "batch")
    async with client(url, DAVE) as ai:
        with pytest.raises(openai.PermissionDeniedError):  # a named band is not downgraded
            await ai.chat.completions.create(
                model=MODEL, messages=MESSAGES, extra_headers={"X-Fairq-Band": "interactive"}
            )
