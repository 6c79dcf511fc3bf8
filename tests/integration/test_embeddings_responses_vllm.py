"""Against a real vLLM 0.32 (CPU build, the benchmarks' tiny model): ``/v1/responses`` and
``/v1/embeddings`` through the official ``openai`` client, fairq's gateway, a dispatcher
and a worker. The tiny model generates: its vLLM serves the Responses API whole and
streamed (vLLM's own events, relayed as they came; usage recorded on the job) and answers
``/v1/embeddings`` with its own 404, which fairq passes on. The same weights served as an
embedding model (``--runner pooling --convert embed``) in a second vLLM serve embeddings.

Slow (each vLLM starts in about 30 s): it runs only with ``FAIRQ_TEST_VLLM=1``, and after
``make bench-vllm-setup`` (or with ``FAIRQ_VLLM_HOME`` naming a home that has vLLM).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import orjson
import pytest
from redis.asyncio import Redis

from benchmarks.lib.vllm_engine import Runner, has_model, is_installed, resolve_home, running_vllm
from fairq.stack.localredis import free_port
from tests.support.eventually import WAIT_S
from tests.support.settings import ALICE_KEY, MODEL, make_settings
from tests.support.stack import components, job_field
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

OUTPUT_TOKENS = 12


def _why_not() -> str | None:
    if os.environ.get("FAIRQ_TEST_VLLM") != "1":
        return "slow (a real vLLM starts in ~30 s): FAIRQ_TEST_VLLM=1 runs it"
    home = resolve_home()
    if not (is_installed(home) and has_model(home)):
        return f"no vLLM and tiny model in {home.root} (make bench-vllm-setup)"
    return None


def _vllm(runner: Runner) -> Iterator[str]:
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    with running_vllm(port=free_port(), policy="fcfs", served_name=MODEL, runner=runner) as url:
        yield url


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    """The tiny model, generating."""
    yield from _vllm("generate")


@pytest.fixture(scope="module")
def pooling_url() -> Iterator[str]:
    """The tiny model as an embedding model."""
    yield from _vllm("pooling")


@contextlib.asynccontextmanager
async def fairq_before(redis_url: str, engine: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official client, talking to fairq's gateway in front of ``engine``."""
    settings = make_settings(
        redis_url, [engine], quick=True,
        model_fields={"engine": "vllm", "allow_fields": ["ignore_eos"]},
    )  # fmt: skip
    with gateway_server(settings) as served:
        async with components(settings):
            ai = openai.AsyncOpenAI(
                base_url=f"{served}/v1", api_key=ALICE_KEY, max_retries=0, timeout=WAIT_S
            )
            async with ai:
                yield ai


async def usage_of(aredis: Redis, job_id: str) -> dict[str, Any]:
    usage: dict[str, Any] = orjson.loads(await job_field(aredis, job_id, "usage"))
    return usage


# The random-weight model may pick its end-of-text token at any step: ignore_eos (a vLLM
# field the model allows) makes every answer exactly OUTPUT_TOKENS long.
ASK: dict[str, Any] = {
    "model": MODEL,
    "input": "def main():",
    "instructions": "be brief",
    "max_output_tokens": OUTPUT_TOKENS,
    "temperature": 0.0,
    "extra_body": {"ignore_eos": True},
}


async def test_a_response_from_vllm_is_queued_and_answered_in_the_responses_shape(
    vllm_url: str, redis_url: str, aredis: Redis
) -> None:
    async with fairq_before(redis_url, vllm_url) as ai:
        raw = await ai.responses.with_raw_response.create(**ASK)
    answer, job_id = raw.parse(), raw.headers["x-fairq-job-id"]
    assert answer.id == f"resp_{job_id}" and answer.object == "response"
    assert answer.output_text and answer.status == "incomplete"  # at its limit
    assert answer.usage is not None and answer.usage.output_tokens == OUTPUT_TOKENS
    assert answer.service_tier == "priority"  # alice's default band, the top one
    assert await job_field(aredis, job_id, "k") == "response"
    assert await job_field(aredis, job_id, "fin") == "max_output_tokens"
    usage = await usage_of(aredis, job_id)  # in fairq's names, for fairness and quotas
    assert usage["completion_tokens"] == OUTPUT_TOKENS
    assert usage["prompt_tokens"] == answer.usage.input_tokens > 0


async def test_a_streamed_response_from_vllm_relays_its_events_and_records_usage(
    vllm_url: str, redis_url: str, aredis: Redis
) -> None:
    async with fairq_before(redis_url, vllm_url) as ai:
        stream = await ai.responses.create(**ASK, stream=True)
        events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    # vLLM ends a response cut at its limit with response.completed, status incomplete
    assert kinds[-1] == "response.completed", kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))  # none lost
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response  # type: ignore[union-attr]
    assert deltas == done.output_text and deltas and done.status == "incomplete"
    assert done.usage is not None and done.usage.output_tokens == OUTPUT_TOKENS
    assert done.service_tier == "priority"
    job_id = done.id.removeprefix("resp_")
    assert await job_field(aredis, job_id, "k") == "response"
    assert await job_field(aredis, job_id, "fin") == "max_output_tokens"
    usage = await usage_of(aredis, job_id)
    assert usage["completion_tokens"] == OUTPUT_TOKENS
    assert usage["prompt_tokens"] == done.usage.input_tokens > 0


async def test_embeddings_from_a_pooling_vllm_are_one_normalized_vector_per_input(
    pooling_url: str, redis_url: str, aredis: Redis
) -> None:
    async with fairq_before(redis_url, pooling_url) as ai:
        raw = await ai.embeddings.with_raw_response.create(
            model=MODEL, input=["hello there", "general kenobi"]
        )  # the client asks for base64 and decodes it
        again = await ai.embeddings.create(model=MODEL, input="hello there")
    answer, job_id = raw.parse(), raw.headers["x-fairq-job-id"]
    assert [e.index for e in answer.data] == [0, 1]
    first = answer.data[0].embedding
    assert len(first) == 128  # the tiny model's hidden size
    assert math.isclose(sum(x * x for x in first), 1.0, rel_tol=1e-2)  # bf16
    assert again.data[0].embedding == pytest.approx(first, abs=1e-2)
    assert answer.data[1].embedding != pytest.approx(first, abs=1e-2)
    assert answer.usage.prompt_tokens > 0
    assert await job_field(aredis, job_id, "k") == "embedding"
    assert (await usage_of(aredis, job_id))["prompt_tokens"] == answer.usage.prompt_tokens


async def test_a_generative_vllm_refuses_embeddings_and_fairq_passes_its_404_on(
    vllm_url: str, redis_url: str
) -> None:
    async with fairq_before(redis_url, vllm_url) as ai:
        with pytest.raises(openai.NotFoundError) as refused:
            await ai.embeddings.create(model=MODEL, input="x")
    # vLLM registers no /v1/embeddings route for a generative model: its own 404 body
    assert refused.value.code == "engine_http_404"
    assert '{"detail":"Not Found"}' in refused.value.message
