"""Engine faults, each injected by the simulator (``sim_fault``) or a dead port.

The dispatcher and a worker run in the test's event loop, the simulator and
(where the client's view matters) the gateway under real uvicorn servers. A
fault before the job's first output is retried; after it, the job fails with
the engine's reason and the client never sees a token twice. No job is left
running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import orjson
import pytest
from prometheus_client import REGISTRY

from broker import AsyncClient, JobFailed, JobState, ResultEvent
from fairq.stack.localredis import free_port
from tests.support.eventually import WAIT_S
from tests.support.settings import ALICE_KEY, MODEL, SIM_FAULTS, make_settings
from tests.support.stack import components, gateway, sim

pytestmark = pytest.mark.integration

PROMPT = [{"role": "user", "content": "hello"}]
TOKENS = 6


@pytest.fixture
def engine() -> Iterator[str]:
    with sim() as url:
        yield url


@contextlib.asynccontextmanager
async def fairq(redis_url: str, endpoint: str, **overrides: Any) -> AsyncIterator[AsyncClient]:
    settings = make_settings(
        redis_url, [endpoint], quick=True, model_fields=SIM_FAULTS, **overrides
    )
    async with components(settings), AsyncClient(settings, api_key=ALICE_KEY) as client:
        yield client


def retries() -> float:
    return REGISTRY.get_sample_value("fairq_worker_engine_retries_total") or 0.0


async def run(client: AsyncClient, fault: dict[str, Any] | None, **body: Any) -> Result:
    extra = {"sim_fault": fault} if fault else {}
    job_id = await client.submit(MODEL, messages=PROMPT, max_tokens=TOKENS, **extra, **body)
    events: list[ResultEvent] = []
    failure = None
    async with asyncio.timeout(WAIT_S):
        try:
            async for event in client.events(job_id):
                events.append(event)
        except JobFailed as exc:
            failure = exc
    job = await client.status(job_id)
    assert job.state.terminal  # never left running
    return Result(job.state, job.error or {}, events, failure)


class Result:
    def __init__(self, state: JobState, error: dict[str, Any], events: list[ResultEvent],
                 failure: JobFailed | None) -> None:  # fmt: skip
        self.state, self.error, self.failure = state, error, failure
        self.events = [e for ev in events if ev.chunk for e in ev.chunk.split(b"\n\n") if e]
        self.body = next((ev.body for ev in events if ev.body), None)

    @property
    def tokens(self) -> list[str]:
        """The content of every token event (the chat role chunk has none)."""
        out = []
        for event in self.events:
            delta = orjson.loads(event.removeprefix(b"data: "))["choices"][0]["delta"]
            if delta.get("content"):
                out.append(delta["content"])
        return out


async def test_a_5xx_before_the_first_token_is_retried_and_the_job_completes(
    redis_url: str, engine: str
) -> None:
    before = retries()
    async with fairq(redis_url, engine) as client:
        done = await run(client, {"kind": "status", "status": 503, "times": 2}, stream=True)
    assert done.state is JobState.COMPLETED and len(done.tokens) == TOKENS
    assert retries() - before == 2


async def test_a_5xx_on_every_call_fails_after_the_allowed_tries_with_the_engines_reason(
    redis_url: str, engine: str
) -> None:
    before = retries()
    fault = {"kind": "status", "status": 500, "message": "CUDA error: out of memory"}
    async with fairq(redis_url, engine, engine_max_tries=2) as client:
        failed = await run(client, fault, stream=True)
    assert failed.state is JobState.FAILED and failed.tokens == []
    assert failed.error["code"] == "engine_http_500" and failed.error["status"] == 502
    assert "CUDA error: out of memory" in str(failed.error["message"])
    assert retries() - before == 1


async def test_an_engine_that_refuses_connections_fails_the_job_as_unreachable(
    redis_url: str,
) -> None:
    # The tries in place alone: handing the job back for another endpoint is
    # tests/integration/test_reroute.py's.
    before = retries()
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with fairq(redis_url, nobody, engine_max_tries=2, engine_max_reroutes=0) as client:
        failed = await run(client, None, stream=True)
    assert failed.state is JobState.FAILED and failed.error["code"] == "engine_unreachable"
    assert "could not be reached" in str(failed.error["message"])
    assert retries() - before == 1


async def test_a_silent_engine_before_the_first_token_is_retried_and_completes(
    redis_url: str, engine: str
) -> None:
    before = retries()
    async with fairq(redis_url, engine, engine_stream_idle_timeout_s=0.3) as client:
        done = await run(client, {"kind": "hang", "times": 1}, stream=True)
    assert done.state is JobState.COMPLETED and len(done.tokens) == TOKENS
    assert retries() - before == 1


async def test_a_silent_engine_after_the_first_token_fails_with_a_timeout_and_no_repeat(
    redis_url: str, engine: str
) -> None:
    before = retries()
    async with fairq(redis_url, engine, engine_stream_idle_timeout_s=0.3) as client:
        failed = await run(client, {"kind": "hang", "after_tokens": 2}, stream=True)
    assert failed.state is JobState.FAILED
    assert failed.error["code"] == "engine_timeout" and failed.error["status"] == 504
    assert len(failed.tokens) == 2  # what was sent before the silence, once
    assert retries() == before  # output was written: not safe to call again


async def test_a_non_streamed_request_whose_engine_hangs_is_retried_within_the_read_timeout(
    redis_url: str, engine: str
) -> None:
    async with fairq(redis_url, engine, engine_read_timeout_s=0.3) as client:
        done = await run(client, {"kind": "hang", "times": 1})
    assert done.state is JobState.COMPLETED and done.body is not None
    assert orjson.loads(done.body)["usage"]["completion_tokens"] == TOKENS


async def test_a_stream_cut_before_the_first_token_is_retried_and_completes(
    redis_url: str, engine: str
) -> None:
    async with fairq(redis_url, engine) as client:
        done = await run(client, {"kind": "cut", "times": 1}, stream=True)
    assert done.state is JobState.COMPLETED and len(done.tokens) == TOKENS


async def test_a_stream_cut_mid_way_fails_the_job_instead_of_completing_it_short(
    redis_url: str, engine: str
) -> None:
    async with fairq(redis_url, engine) as client:
        failed = await run(client, {"kind": "cut", "after_tokens": 3}, stream=True)
    assert failed.state is JobState.FAILED and failed.error["code"] == "engine_stream_cut"
    assert "before the response was complete" in str(failed.error["message"])
    assert len(failed.tokens) == 3
    assert failed.failure is not None  # the client is told, not left with a short answer


async def test_a_malformed_chunk_fails_the_job_and_never_reaches_the_client(
    redis_url: str, engine: str
) -> None:
    async with fairq(redis_url, engine) as client:
        failed = await run(client, {"kind": "malformed", "after_tokens": 2}, stream=True)
    assert failed.state is JobState.FAILED and failed.error["code"] == "engine_bad_chunk"
    assert len(failed.tokens) == 2  # every event passed on parses (tokens would raise)


async def test_an_error_event_mid_stream_fails_the_job_with_the_engines_message(
    redis_url: str, engine: str
) -> None:
    fault = {"kind": "error_event", "after_tokens": 2, "message": "engine dead: NCCL timeout"}
    async with fairq(redis_url, engine) as client:
        failed = await run(client, fault, stream=True)
    assert failed.state is JobState.FAILED and failed.error["code"] == "engine_stream_error"
    assert "NCCL timeout" in str(failed.error["message"]) and len(failed.tokens) == 2


async def test_a_too_long_prompt_is_a_400_invalid_request_with_the_engines_message(
    redis_url: str, engine: str
) -> None:
    settings = make_settings(redis_url, [engine], quick=True)
    too_long = [{"role": "user", "content": "word " * 5000}]  # > 4096 tokens of context
    before = retries()
    async with components(settings):
        with gateway(settings) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=ALICE_KEY, max_retries=0)
            with pytest.raises(openai.BadRequestError) as info:
                await asyncio.to_thread(
                    client.chat.completions.create, model=MODEL, messages=too_long
                )
            with pytest.raises(openai.APIError) as streamed:
                stream = await asyncio.to_thread(
                    client.chat.completions.create, model=MODEL, messages=too_long, stream=True
                )
                await asyncio.to_thread(list, stream)
    assert info.value.status_code == 400
    error = info.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error"
    assert "maximum context length is 4096 tokens" in error["message"]
    assert "maximum context length" in streamed.value.message
    assert retries() == before  # a 400 is the request's fault: never called again
