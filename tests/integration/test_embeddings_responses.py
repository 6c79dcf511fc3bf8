"""``/v1/embeddings`` and ``/v1/responses`` through the official ``openai`` client: queued
as any request (the job's record says its kind, band and usage), answered in the
endpoint's own shape, a Responses stream relayed as the engine's named events. Real
Redis, the simulator and the gateway under uvicorn, the dispatcher and a worker in the
test's loop."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest
from redis.asyncio import Redis

from tests.support.eventually import WAIT_S
from tests.support.settings import ALICE_KEY, MODEL, make_settings
from tests.support.stack import FAST, components, job_field, sim
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration


@pytest.fixture
async def url(redis_url: str) -> AsyncIterator[str]:
    with sim() as engine:
        settings = make_settings(redis_url, [engine], quick=True)
        with gateway_server(settings) as served:
            async with components(settings):
                yield served


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key=ALICE_KEY, max_retries=0, timeout=WAIT_S
    )


async def usage_of(aredis: Redis, job_id: str) -> dict[str, Any]:
    usage: dict[str, Any] = orjson.loads(await job_field(aredis, job_id, "usage"))
    return usage


async def test_embeddings_are_queued_and_answered_one_vector_per_input(
    url: str, aredis: Redis
) -> None:
    async with client(url) as ai:
        raw = await ai.embeddings.with_raw_response.create(
            model=MODEL, input=["hello there", "general kenobi"]
        )  # the client asks for base64 and decodes it
        again = await ai.embeddings.create(model=MODEL, input="hello there", dimensions=8)
    answer, job_id = raw.parse(), raw.headers["x-fairq-job-id"]
    assert [e.index for e in answer.data] == [0, 1]
    first = answer.data[0].embedding
    assert math.isclose(sum(x * x for x in first), 1.0, rel_tol=1e-5)
    assert again.data[0].embedding == pytest.approx(first, rel=1e-5)  # deterministic
    assert answer.data[1].embedding != pytest.approx(first)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 0
    assert await job_field(aredis, job_id, "k") == "embedding"
    assert (await usage_of(aredis, job_id))["prompt_tokens"] == answer.usage.prompt_tokens


async def test_an_embedding_refuses_fields_openai_does_not_have(url: str) -> None:
    async with client(url) as ai:
        with pytest.raises(openai.BadRequestError) as refused:
            await ai.embeddings.create(model=MODEL, input="x", extra_body={"stream": True})
    assert refused.value.code == "field_not_allowed"


async def test_a_model_without_embeddings_passes_the_engines_error_on(redis_url: str) -> None:
    with sim(FAST.model_copy(update={"embeddings": False})) as engine:
        settings = make_settings(redis_url, [engine], quick=True)
        with gateway_server(settings) as served:
            async with components(settings), client(served) as ai:
                with pytest.raises(openai.NotFoundError) as refused:
                    await ai.embeddings.create(model=MODEL, input="x")
    assert "404" in refused.value.message


async def test_a_response_is_queued_and_answered_in_the_responses_shape(
    url: str, aredis: Redis
) -> None:
    async with client(url) as ai:
        raw = await ai.responses.with_raw_response.create(
            model=MODEL, input="say hi", instructions="be brief", max_output_tokens=5
        )
    answer, job_id = raw.parse(), raw.headers["x-fairq-job-id"]
    assert answer.id == f"resp_{job_id}" and answer.object == "response"
    assert answer.output_text.strip() and answer.status == "incomplete"  # at its limit
    assert answer.usage is not None and answer.usage.output_tokens == 5
    assert answer.service_tier == "priority"  # alice's default band, the top one
    assert await job_field(aredis, job_id, "k") == "response"
    usage = await usage_of(aredis, job_id)  # in fairq's names, for fairness and quotas
    assert usage["completion_tokens"] == 5
    assert usage["prompt_tokens"] == answer.usage.input_tokens


async def test_a_streamed_response_relays_the_engines_events(url: str, aredis: Redis) -> None:
    async with client(url) as ai:
        stream = await ai.responses.create(model=MODEL, input="say hi", stream=True)
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response  # type: ignore[union-attr]
    assert deltas == done.output_text and deltas.strip()
    assert done.service_tier == "priority"
    job_id = done.id.removeprefix("resp_")
    assert (await usage_of(aredis, job_id))["completion_tokens"] == done.usage.output_tokens


async def test_a_response_refuses_stored_state_but_takes_store_false(url: str) -> None:
    async with client(url) as ai:
        with pytest.raises(openai.BadRequestError) as refused:
            await ai.responses.create(model=MODEL, input="x", previous_response_id="resp_1")
        answer = await ai.responses.create(model=MODEL, input="x", store=False)
    assert refused.value.code == "field_not_allowed"
    assert answer.status == "completed"
