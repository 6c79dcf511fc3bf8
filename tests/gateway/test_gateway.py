"""The HTTP gateway end to end: real Redis, real uvicorn on loopback, httpx and openai.

There is no dispatcher or worker here: ``StandIn`` plays both through the broker's
real API (dispatch the head job, claim it, start it, write its results, end it).
A streamed request's headers wait for its first token or its end (``streamed`` sends
one in a task of its own); ``EARLY`` asks for them at once, where a test needs the job
id of a queued stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import orjson
import pytest
import redis
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam
from redis.asyncio import Redis

from broker import (
    Claimed,
    DispatchStore,
    ExecutionStore,
    JobQueue,
    JobState,
    Outcome,
    Pick,
    Settings,
    StreamMode,
    keys,
)
from broker.position import NO_DRAIN
from fairq.stack.localredis import free_port
from gateway import outcomes, sse
from gateway.errors import ERROR_ID_HEADER
from tests.support.eventually import aeventually, eventually
from tests.support.settings import (
    ALICE,
    ALICE_KEY,
    BOB,
    BOB_KEY,
    api_key,
    make_config,
    make_settings,
)
from tests.support.stack import gateway as gateway_server
from tests.support.stack import wait_healthy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(10)]

MODEL = "tiny-chat"
OTHER_MODEL = "org/other-model"
ENDPOINT = "http://engine-0:8000"
JOB_HEADER = "x-fairq-job-id"
APP_KEY = "k-app"
APP = {"Authorization": f"Bearer {APP_KEY}"}
DONE = b"data: [DONE]\n\n"
WAIT_S = 5.0
EARLY = {"X-Fairq-Stream-Headers": "early"}  # the 200 and the job id at once


# Plain values, so that a gateway in a subprocess can be configured from their repr.
CONFIG = make_config(
    models=[
        {"name": MODEL, "endpoints": [ENDPOINT]},
        {"name": OTHER_MODEL, "engine": "openai", "endpoints": ["http://engine-1:8000"]},
    ],
    api_keys=[
        api_key(ALICE_KEY, "alice"),
        api_key(BOB_KEY, "bob", bands=["batch"], models=[MODEL]),
        api_key(APP_KEY, "app", trusted_app=True),
    ],
    max_body_bytes=4096,
)


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def chat_chunk(job_id: str, content: str, finish: str | None = None) -> bytes:
    """One SSE event as vLLM writes it and the worker stores it."""
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    chunk = {
        "id": f"chatcmpl-{job_id}",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [choice],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def chat_body(job_id: str, content: str) -> bytes:
    message = {"role": "assistant", "content": content}
    return orjson.dumps(
        {
            "id": f"chatcmpl-{job_id}",
            "object": "chat.completion",
            "created": 1,
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


class StandIn:
    """The dispatcher and one worker, played through the broker's real API."""

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self.redis = redis
        self.dispatch = DispatchStore(redis, settings)
        self.execution = ExecutionStore(redis, settings)

    async def take(self, model: str = MODEL) -> Claimed:
        """Dispatch the first queued job of ``model`` and start it as a worker would."""
        await self.dispatch.ensure_ready_group(model)
        await aeventually(
            lambda: self._dispatch_head(model), "the head job dispatched", WAIT_S, interval_s=0.01
        )
        claimed: list[Claimed] = await aeventually(
            lambda: self.execution.claim(self.redis, [model], "w-test", 1, 100),
            "the dispatched job claimed",
            WAIT_S,
            interval_s=0,
        )
        assert await self.execution.start(claimed[0], "w-test") == 1
        return claimed[0]

    async def _dispatch_head(self, model: str) -> list[str]:
        snapshot = await self.dispatch.snapshot(model, depth=1)
        if snapshot.empty:
            return []
        backlog = snapshot.backlogs[0]
        user, score = backlog.users[0]
        pick = Pick(backlog.band, user, score + 1, backlog.join)
        ids = (await self.dispatch.dispatch(model, ENDPOINT, 8, [pick], 1)).ids
        return ids

    async def finish(
        self,
        job: Claimed,
        *,
        chunks: Sequence[bytes] = (),
        body: bytes | None = None,
        outcome: Outcome | None = None,
    ) -> None:
        """Write the results and end the job in one pipeline, as the worker does."""
        await self.execution.load_scripts()
        pipe = self.execution.pipeline()
        for seq, chunk in enumerate(chunks, start=1):
            ExecutionStore.add_chunk(pipe, job.model, job.job_id, b"0-%d" % seq, chunk)
        if body is not None:
            ExecutionStore.add_body(pipe, job.model, job.job_id, b"0-%d" % (len(chunks) + 1), body)
        outcome = outcome or Outcome(JobState.COMPLETED, finish_reason="stop")
        self.execution.add_complete(pipe, job, outcome)
        await pipe.execute()

    async def backlogged_users(self, model: str = MODEL) -> list[str]:
        snapshot = await self.dispatch.snapshot(model, depth=100)
        return [user for band in snapshot.backlogs for user, _ in band.users]


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return make_settings(redis_url, **CONFIG)


@pytest.fixture
def gateway(settings: Settings) -> Iterator[str]:
    with gateway_server(settings) as url:
        yield url


@pytest.fixture
async def http(gateway: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway, timeout=WAIT_S) as client:
        yield client


@pytest.fixture
def standin(aredis: Redis, settings: Settings) -> StandIn:
    return StandIn(aredis, settings)


@pytest.fixture
def openai_client(gateway: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"{gateway}/v1", api_key="k-alice", max_retries=0, timeout=WAIT_S
    )
    yield client
    client.close()


def streamed(
    http: httpx.AsyncClient, headers: dict[str, str], body: dict[str, object]
) -> asyncio.Task[httpx.Response]:
    """A streamed request, sent at once; the task ends when its response headers came."""
    request = http.build_request("POST", "/v1/chat/completions", headers=headers, json=body)
    return asyncio.create_task(http.send(request, stream=True))


@contextlib.asynccontextmanager
async def opened(request: asyncio.Task[httpx.Response]) -> AsyncIterator[httpx.Response]:
    """The response of a ``streamed`` request, closed at the end of the block."""
    response = await asyncio.wait_for(request, WAIT_S)
    try:
        yield response
    finally:
        await response.aclose()


async def read_all(response: httpx.Response) -> bytes:
    """The body without its SSE ``id:`` lines (tests/integration/test_resume.py checks those)."""
    async with asyncio.timeout(WAIT_S):
        return re.sub(rb"(?m)^id: [^\n]*\n", b"", await response.aread())


async def job_status(http: httpx.AsyncClient, job_id: str, headers: dict[str, str]) -> str:
    response = await http.get(f"/v1/jobs/{job_id}", headers=headers)
    assert response.status_code == 200, response.text
    status: str = response.json()["status"]
    return status


async def wait_for_status(http: httpx.AsyncClient, job_id: str, status: str) -> None:
    await aeventually(
        lambda: job_status(http, job_id, ALICE),
        f"the job {status}",
        WAIT_S,
        until=lambda seen: seen == status,
    )


def assert_error(response: httpx.Response, status: int, code: str | None) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, object] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert isinstance(error["message"], str) and error["message"]
    return error


# --- streaming -------------------------------------------------------------------------


async def test_streaming_passes_engine_chunks_through_and_ends_with_done(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    request = streamed(http, ALICE, chat(stream=True))
    job = await standin.take()
    assert not request.done()  # no headers before the first token
    chunks = [chat_chunk(job.job_id, "Hel"), chat_chunk(job.job_id, "lo", "stop")]
    await standin.finish(job, chunks=chunks)
    async with opened(request) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert job.job_id == r.headers[JOB_HEADER]
        assert await read_all(r) == b"".join(chunks) + DONE
    # A stream that ran to its end is not cancelled when the connection closes.
    assert await job_status(http, job.job_id, ALICE) == "completed"


async def test_engine_payload_carries_job_id_and_asks_for_usage(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    body = chat(stream=True, stream_options={"include_usage": True}, user="not-a-trusted-app")
    request = streamed(http, ALICE, body)
    job = await standin.take()
    await standin.finish(job)
    async with opened(request) as r:
        assert r.status_code == 200  # a job that ended well without a token: 200 all the same
        assert await read_all(r) == DONE
    payload = orjson.loads(job.payload)
    assert payload["request_id"] == job.job_id
    assert payload["stream_options"] == {"include_usage": True}
    assert "user" not in payload
    assert job.stream_flag == "2"
    assert job.endpoint == ENDPOINT


async def test_a_job_that_fails_after_its_first_token_ends_its_stream_with_an_error_event(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    error = {"message": "engine returned 500", "type": "server_error", "code": "engine_error"}
    request = streamed(http, ALICE, chat(stream=True))
    job = await standin.take()
    first = chat_chunk(job.job_id, "Hel")
    failed = Outcome(JobState.FAILED, error={**error, "status": 502})
    await standin.finish(job, chunks=[first], outcome=failed)
    async with opened(request) as r:
        assert r.status_code == 200
        raw = await read_all(r)
    shown = outcomes.shown_message(failed.error or {}, job.job_id)  # a 5xx: not the worker's
    body = {"error": {"message": shown, "type": error["type"], "param": None,
                      "code": error["code"]}}  # fmt: skip
    assert raw == first + b"data: " + orjson.dumps(body) + b"\n\n" + DONE


async def test_a_stream_that_fails_before_its_first_token_gets_the_unstreamed_answer(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    error = {"message": "too long", "type": "invalid_request_error", "param": "max_tokens",
             "code": "engine_http_400", "status": 400}  # fmt: skip
    answers = []
    for body in (chat(stream=True), chat()):
        request = streamed(http, ALICE, body)
        job = await standin.take()
        await standin.finish(job, outcome=Outcome(JobState.FAILED, error=error))
        async with opened(request) as r:
            await r.aread()
            assert r.headers[JOB_HEADER] == job.job_id
            answers.append((r.status_code, r.headers["content-type"], r.content))
    assert answers[0] == answers[1]
    assert assert_error(r, 400, "engine_http_400")["param"] == "max_tokens"
    assert await job_status(http, job.job_id, ALICE) == "failed"


async def test_early_headers_answer_a_queued_stream_at_once_and_report_a_failure_as_an_event(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    error = {"message": "too long", "type": "invalid_request_error", "param": "max_tokens",
             "code": "engine_http_400"}  # fmt: skip
    async with http.stream(
        "POST", "/v1/chat/completions", headers={**ALICE, **EARLY}, json=chat(stream=True)
    ) as r:
        assert r.status_code == 200
        job = await standin.take()
        assert job.job_id == r.headers[JOB_HEADER]
        failed = Outcome(JobState.FAILED, error={**error, "status": 400})
        await standin.finish(job, outcome=failed)
        raw = await read_all(r)
    assert raw == b"data: " + orjson.dumps({"error": error}) + b"\n\n" + DONE
    bad = await http.post(
        "/v1/chat/completions",
        headers={**ALICE, "X-Fairq-Stream-Headers": "soon"},
        json=chat(stream=True),
    )
    assert_error(bad, 400, "invalid_stream_headers")
    assert await standin.backlogged_users() == []


async def test_streaming_client_that_leaves_while_queued_cancels_its_job(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    request = streamed(http, ALICE, chat(stream=True))
    job_id = await _only_job_id(standin)  # its headers wait for its first token
    request.cancel()  # httpx closes the connection under a cancelled request
    with contextlib.suppress(asyncio.CancelledError):
        await request
    await wait_for_status(http, job_id, "cancelled")
    assert await standin.backlogged_users() == []


async def test_queued_stream_gets_its_headers_and_keep_alive_comments_after_a_lull(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "HEARTBEAT_S", 0.05)
    async with http.stream(
        "POST", "/v1/chat/completions", headers=ALICE, json=chat(stream=True)
    ) as r:
        assert r.status_code == 200
        async with asyncio.timeout(WAIT_S):
            first = await anext(r.aiter_raw())
    assert first.startswith(b": keep-alive\n\n")


# What a worker writes when its engine's connection broke (``workers.engine``).
ENGINE_HOST = "10.4.0.17:8000"
BROKE = {"message": f"the engine connection broke at http://{ENGINE_HOST}/v1/chat/completions: "
         "Server disconnected without sending a response.", "type": "engine_error",
         "param": None, "code": "engine_stream_cut", "status": 502}  # fmt: skip


def assert_told_without_internals(error: dict[str, object], job_id: str) -> None:
    message = str(error["message"])
    assert error["code"] == "engine_stream_cut" and job_id in message
    assert ENGINE_HOST not in message and "http" not in message and "Server" not in message


async def test_a_failure_reaches_its_client_without_engine_urls_and_with_its_job_id(
    http: httpx.AsyncClient, standin: StandIn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    whole = asyncio.create_task(http.post("/v1/chat/completions", headers=ALICE, json=chat()))
    job = await standin.take()
    await standin.finish(job, outcome=Outcome(JobState.FAILED, error=BROKE))
    assert_told_without_internals(assert_error(await whole, 502, "engine_stream_cut"), job.job_id)
    polled = (await http.get(f"/v1/jobs/{job.job_id}", headers=ALICE)).json()
    assert_told_without_internals(polled["error"], job.job_id)
    request = streamed(http, ALICE, chat(stream=True))  # failed after its first token
    streamed_job = await standin.take()
    first = chat_chunk(streamed_job.job_id, "Hel")
    failed = Outcome(JobState.FAILED, error=BROKE)
    await standin.finish(streamed_job, chunks=[first], outcome=failed)
    async with opened(request) as r:
        event = (await read_all(r)).removeprefix(first).split(b"\n\n")[0]
    assert_told_without_internals(orjson.loads(event.removeprefix(b"data: "))["error"],
                                  streamed_job.job_id)  # fmt: skip
    # The worker logs the detail once, when the job fails (tests/workers/
    # test_failure_log.py); answering or reading the job logs nothing more.
    assert not any(job.job_id in r.getMessage() for r in caplog.records)


# --- non-streaming ---------------------------------------------------------------------


async def test_non_streaming_returns_the_engine_body(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    request = asyncio.create_task(http.post("/v1/chat/completions", headers=ALICE, json=chat()))
    job = await standin.take()
    assert job.stream_flag is StreamMode.WHOLE  # streamed from the engine, one body to its client
    body = chat_body(job.job_id, "hello")
    await standin.finish(job, body=body)
    response = await asyncio.wait_for(request, WAIT_S)
    assert response.status_code == 200
    assert response.content == body
    assert response.headers[JOB_HEADER] == job.job_id
    assert await job_status(http, job.job_id, ALICE) == "completed"


async def test_non_streaming_failed_job_answers_with_the_status_the_error_carries(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    request = asyncio.create_task(http.post("/v1/chat/completions", headers=ALICE, json=chat()))
    job = await standin.take()
    error = {
        "message": "engine overloaded",
        "type": "server_error",
        "code": "engine",
        "status": 503,
    }
    await standin.finish(job, outcome=Outcome(JobState.FAILED, error=error))
    response = await asyncio.wait_for(request, WAIT_S)
    told = str(assert_error(response, 503, "engine")["message"])
    assert "engine overloaded" not in told and job.job_id in told  # a 5xx: not the worker's
    assert response.headers[JOB_HEADER] == job.job_id


async def test_non_streaming_job_cancelled_elsewhere_answers_409(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    request = asyncio.create_task(http.post("/v1/chat/completions", headers=ALICE, json=chat()))
    job_id = await _only_job_id(standin)
    cancelled = await http.delete(f"/v1/jobs/{job_id}", headers=ALICE)
    assert cancelled.json()["status"] == "cancelled"
    response = await asyncio.wait_for(request, WAIT_S)
    assert assert_error(response, 409, "job_cancelled")["type"] == "cancelled"


async def test_non_streaming_job_that_expires_answers_408(
    http: httpx.AsyncClient, aredis: Redis, settings: Settings
) -> None:
    request = asyncio.create_task(http.post("/v1/chat/completions", headers=ALICE, json=chat()))
    job_id = await _only_job_id(StandIn(aredis, settings))
    # What a deadline keeper does: end the job as expired rather than cancelled.
    await JobQueue(aredis, settings).cancel(job_id, None, JobState.EXPIRED)
    response = await asyncio.wait_for(request, WAIT_S)
    assert assert_error(response, 408, "job_expired")["type"] == "timeout"


async def test_non_streaming_client_that_leaves_cancels_its_job(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    request = asyncio.create_task(http.post("/v1/chat/completions", headers=ALICE, json=chat()))
    job_id = await _only_job_id(standin)
    request.cancel()  # httpx closes the connection under a cancelled request
    with contextlib.suppress(asyncio.CancelledError):
        await request
    await wait_for_status(http, job_id, "cancelled")
    assert await standin.backlogged_users() == []


async def _only_job_id(standin: StandIn) -> str:
    """The id of the one job queued for alice (read from her queue stream)."""
    queue = keys.queue(MODEL, "interactive", "alice")
    entries = await aeventually(
        lambda: standin.redis.xrange(queue), "alice's queued job", WAIT_S, interval_s=0.01
    )
    [(_, fields)] = entries
    job_id: bytes = fields[b"j"]
    return job_id.decode()


# --- the official openai client --------------------------------------------------------


def ask(client: openai.OpenAI) -> ChatCompletion:
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])


def ask_streamed(client: openai.OpenAI) -> openai.Stream[ChatCompletionChunk]:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    return client.chat.completions.create(model=MODEL, messages=messages, stream=True)


async def test_openai_client_reads_a_non_streamed_completion(
    openai_client: openai.OpenAI, standin: StandIn
) -> None:
    call = asyncio.create_task(asyncio.to_thread(ask, openai_client))
    job = await standin.take()
    await standin.finish(job, body=chat_body(job.job_id, "hello"))
    completion = await asyncio.wait_for(call, WAIT_S)
    assert completion.id == f"chatcmpl-{job.job_id}"
    assert completion.choices[0].message.content == "hello"


async def test_openai_client_reads_a_stream(openai_client: openai.OpenAI, standin: StandIn) -> None:
    call = asyncio.create_task(asyncio.to_thread(ask_streamed, openai_client))
    job = await standin.take()
    chunks = [chat_chunk(job.job_id, "Hel"), chat_chunk(job.job_id, "lo", "stop")]
    await standin.finish(job, chunks=chunks)
    stream = await asyncio.wait_for(call, WAIT_S)
    deltas = await asyncio.to_thread(lambda: [c.choices[0].delta.content for c in stream])
    assert "".join(d or "" for d in deltas) == "Hello"


async def test_openai_client_raises_a_status_error_for_a_stream_that_failed_before_output(
    openai_client: openai.OpenAI, standin: StandIn
) -> None:
    call = asyncio.create_task(asyncio.to_thread(ask_streamed, openai_client))
    job = await standin.take()
    error: dict[str, object] = {
        "message": "engine died",
        "type": "server_error",
        "code": "engine_error",
    }
    await standin.finish(job, outcome=Outcome(JobState.FAILED, error=error))
    with pytest.raises(openai.APIStatusError, match=job.job_id) as raised:
        await asyncio.wait_for(call, WAIT_S)
    assert raised.value.status_code == 502  # an error without a status of its own
    assert raised.value.code == "engine_error"


async def test_openai_client_raises_on_a_stream_that_failed_mid_answer(
    openai_client: openai.OpenAI, standin: StandIn
) -> None:
    call = asyncio.create_task(asyncio.to_thread(ask_streamed, openai_client))
    job = await standin.take()
    error = {"message": "engine died", "type": "server_error", "code": "engine_error"}
    failed = Outcome(JobState.FAILED, error=error)
    await standin.finish(job, chunks=[chat_chunk(job.job_id, "Hel")], outcome=failed)
    stream = await asyncio.wait_for(call, WAIT_S)
    with pytest.raises(openai.APIError, match=job.job_id):
        await asyncio.to_thread(lambda: list(stream))


async def test_openai_client_reads_a_legacy_completion(
    openai_client: openai.OpenAI, standin: StandIn
) -> None:
    call = asyncio.create_task(
        asyncio.to_thread(openai_client.completions.create, model=MODEL, prompt="Say hi")
    )
    job = await standin.take()
    assert job.kind.value == "completion"
    body = {
        "id": f"cmpl-{job.job_id}",
        "object": "text_completion",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "text": "hi", "finish_reason": "stop", "logprobs": None}],
    }
    await standin.finish(job, body=orjson.dumps(body))
    completion = await asyncio.wait_for(call, WAIT_S)
    assert completion.choices[0].text == "hi"


async def test_openai_client_lists_the_models_of_its_key(openai_client: openai.OpenAI) -> None:
    models = await asyncio.to_thread(openai_client.models.list)
    assert sorted(m.id for m in models) == sorted([MODEL, OTHER_MODEL])
    assert {m.owned_by for m in models} == {"fairq"}


# --- bad requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer k-nobody"}, {"Authorization": "Basic k-alice"}],
    ids=["missing", "invalid", "not-bearer"],
)
async def test_requests_without_a_valid_key_get_401(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    assert_error(
        await http.post("/v1/chat/completions", headers=headers, json=chat()),
        401,
        "invalid_api_key",
    )
    assert_error(await http.get("/v1/models", headers=headers), 401, "invalid_api_key")
    assert_error(await http.get("/v1/jobs/x.y", headers=headers), 401, "invalid_api_key")


async def test_unknown_model_and_model_not_allowed_for_the_key_get_404(
    http: httpx.AsyncClient,
) -> None:
    unknown = await http.post("/v1/chat/completions", headers=ALICE, json=chat(model="nope"))
    error = assert_error(unknown, 404, "model_not_found")
    assert error["message"] == "The model `nope` does not exist or you do not have access to it."
    forbidden = await http.post("/v1/chat/completions", headers=BOB, json=chat(model=OTHER_MODEL))
    assert_error(forbidden, 404, "model_not_found")
    listed = (await http.get("/v1/models", headers=BOB)).json()
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == [MODEL]
    assert_error(await http.get(f"/v1/models/{OTHER_MODEL}", headers=BOB), 404, "model_not_found")
    assert (await http.get(f"/v1/models/{OTHER_MODEL}", headers=ALICE)).json()["id"] == OTHER_MODEL


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"model": "tiny-chat", "messages": [', "not valid JSON"),
        (b'{"model": "tiny-chat"}', "'messages'"),
        (b'{"model": "tiny-chat", "messages": []}', "'messages'"),
        (b"[1, 2]", "JSON object"),
        (b'{"model": "tiny-chat", "prompt": "x", "stream_options": "yes"}', "'stream_options'"),
    ],
    ids=["invalid-json", "missing-messages", "empty-messages", "not-an-object", "bad-options"],
)
async def test_invalid_bodies_get_400_with_a_readable_reason(
    http: httpx.AsyncClient, standin: StandIn, content: bytes, reason: str
) -> None:
    path = "/v1/completions" if b"prompt" in content else "/v1/chat/completions"
    response = await http.post(path, headers=ALICE, content=content)
    error = assert_error(response, 400, "invalid_request")
    assert reason in str(error["message"])
    assert await standin.backlogged_users() == []


async def test_oversize_body_gets_413_whether_declared_or_chunked(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    big = orjson.dumps(chat(padding="x" * 5000))
    declared = await http.post("/v1/chat/completions", headers=ALICE, content=big)
    assert_error(declared, 413, "request_too_large")

    async def chunked() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 1024):
            yield big[start : start + 1024]

    streamed = await http.post("/v1/chat/completions", headers=ALICE, content=chunked())
    assert "content-length" not in streamed.request.headers
    assert_error(streamed, 413, "request_too_large")
    assert await standin.backlogged_users() == []


async def test_band_the_key_is_not_entitled_to_gets_403(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    denied = await http.post(
        "/v1/chat/completions", headers={**BOB, "X-Fairq-Band": "interactive"}, json=chat()
    )
    assert_error(denied, 403, "permission_denied")
    headers = {**BOB, "X-Fairq-Band": "batch", **EARLY}
    async with http.stream(
        "POST", "/v1/chat/completions", headers=headers, json=chat(stream=True)
    ) as r:
        job = (await http.get(f"/v1/jobs/{r.headers[JOB_HEADER]}", headers=BOB)).json()
    assert job["band"] == "batch"


async def test_queue_full_gets_429_with_retry_after_and_keeps_queued_jobs(
    redis_url: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, **CONFIG, max_queued_per_user=2, queue_full_retry_after_s=7)
    path, body = "/v1/chat/completions", chat(stream=True)
    with gateway_server(settings) as url:
        async with (
            httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http,
            contextlib.AsyncExitStack() as held,
        ):
            ids = []
            for _ in range(2):
                r = await held.enter_async_context(
                    http.stream("POST", path, headers={**ALICE, **EARLY}, json=body)
                )
                ids.append(r.headers[JOB_HEADER])
            full = await http.post(path, headers=ALICE, json=body)
            assert assert_error(full, 429, "queue_full")["type"] == "rate_limit_error"
            assert full.headers["retry-after"] == "7"
            assert await aredis.xlen(keys.queue(MODEL, "interactive", "alice")) == 2
            for job_id in ids:
                assert await job_status(http, job_id, ALICE) == "queued"


async def test_trusted_app_queues_each_end_user_separately(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    async with contextlib.AsyncExitStack() as held:
        for end_user in ("u1", "u2"):
            body = chat(stream=True, user=end_user)
            r = await held.enter_async_context(
                http.stream("POST", "/v1/chat/completions", headers={**APP, **EARLY}, json=body)
            )
            assert await job_status(http, r.headers[JOB_HEADER], APP) == "queued"
        assert sorted(await standin.backlogged_users()) == ["app/u1", "app/u2"]


# --- jobs ------------------------------------------------------------------------------


async def test_job_status_is_visible_to_its_owner_only(http: httpx.AsyncClient) -> None:
    async with http.stream(
        "POST", "/v1/chat/completions", headers={**ALICE, **EARLY}, json=chat(stream=True)
    ) as r:
        job_id = r.headers[JOB_HEADER]
        own = (await http.get(f"/v1/jobs/{job_id}", headers=ALICE)).json()
        assert own["id"] == job_id
        assert (own["object"], own["status"], own["model"]) == ("fairq.job", "queued", MODEL)
        assert own["queue_position"] == {
            "jobs_ahead": 0,
            "estimated_wait_s": None,
            "estimated_wait_reason": NO_DRAIN,  # no dispatcher: no engine known to drain it
        }
        assert_error(await http.get(f"/v1/jobs/{job_id}", headers=BOB), 404, "not_found")
        assert_error(await http.delete(f"/v1/jobs/{job_id}", headers=BOB), 404, "not_found")
        assert await job_status(http, job_id, ALICE) == "queued"
    for unknown in ("nothing-like-an-id", "dGlueS1jaGF0.00", "bm9wZQ.00"):
        assert_error(await http.get(f"/v1/jobs/{unknown}", headers=ALICE), 404, "not_found")


async def test_delete_cancels_a_queued_job_and_answers_its_stream_409(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    request = streamed(http, ALICE, chat(stream=True))
    job_id = await _only_job_id(standin)
    deleted = await http.delete(f"/v1/jobs/{job_id}", headers=ALICE)
    assert deleted.status_code == 200
    assert deleted.json()["status"] == "cancelled"
    assert await standin.backlogged_users() == []
    async with opened(request) as r:
        await r.aread()
    assert assert_error(r, 409, "job_cancelled")["type"] == "cancelled"
    assert r.headers[JOB_HEADER] == job_id


async def test_delete_ends_the_stream_of_a_queued_job_with_early_headers(
    http: httpx.AsyncClient, standin: StandIn
) -> None:
    async with http.stream(
        "POST", "/v1/chat/completions", headers={**ALICE, **EARLY}, json=chat(stream=True)
    ) as r:
        job_id = r.headers[JOB_HEADER]
        deleted = await http.delete(f"/v1/jobs/{job_id}", headers=ALICE)
        assert deleted.json()["status"] == "cancelled"
        raw = await read_all(r)
    error = {"message": "the request was cancelled", "type": "cancelled", "param": None,
             "code": "job_cancelled"}  # fmt: skip
    assert raw == b"data: " + orjson.dumps({"error": error}) + b"\n\n" + DONE


# --- routes, probes, process -----------------------------------------------------------


async def test_unknown_route_and_wrong_method_get_openai_errors(http: httpx.AsyncClient) -> None:
    assert_error(await http.get("/v1/nope", headers=ALICE), 404, "unknown_url")
    wrong = await http.get("/v1/chat/completions", headers=ALICE)
    assert_error(wrong, 405, "method_not_allowed")
    assert "POST" in wrong.headers["allow"]


async def test_probes_report_process_and_redis(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    assert (await http.get("/readyz")).json() == {"status": "ok"}


async def test_readyz_is_503_when_redis_does_not_answer() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"  # bound, never listening
        with gateway_server(make_settings(dead, **CONFIG)) as url:
            async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
                assert (await http.get("/healthz")).status_code == 200
                assert_error(await http.get("/readyz"), 503, "redis_unavailable")


async def test_a_redis_failure_reaches_its_client_without_redis_s_address_and_with_an_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
        dead = f"redis://:hunter2@127.0.0.1:{port}/0"  # bound, never listening
        with gateway_server(make_settings(dead, **CONFIG)) as url:
            async with httpx.AsyncClient(base_url=url, timeout=WAIT_S, headers=ALICE) as http:
                # redis-py's error, raised through the broker's error and straight
                answers = [await http.post("/v1/chat/completions", json=chat()),
                           await http.get("/v1/files")]  # fmt: skip
    for answer in answers:
        message = str(assert_error(answer, 503, "redis_unavailable")["message"])
        assert port not in message and "127.0.0.1" not in message and "refused" not in message
        told = re.search(r"error id (\w+)", message)
        assert told is not None, message
        assert answer.headers[ERROR_ID_HEADER] == told[1]
        logged = [r.getMessage() for r in caplog.records if told[1] in r.getMessage()]
        assert logged and "refused" in logged[0]  # the operator has the detail
        assert f"Redis at redis://127.0.0.1:{port}/0 failed" in logged[0]  # where, not how
        assert "hunter2" not in logged[0]


def test_serve_answers_queued_streams_and_exits_cleanly_on_sigterm(redis_url: str) -> None:
    port = free_port()
    code = (
        "from broker import Settings\nfrom fairq.services import run_gateway\n"
        f"run_gateway(Settings(redis_url={redis_url!r}, **{CONFIG!r}), '127.0.0.1', {port})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    client = redis.Redis.from_url(redis_url)
    url, body = f"{base}/v1/chat/completions", chat(stream=True)
    try:
        wait_healthy(f"{base}/healthz", proc, "the gateway process", WAIT_S)
        with (
            httpx.stream("POST", url, headers={**ALICE, **EARLY}, json=body) as r,
            ThreadPoolExecutor(1) as pool,
        ):
            job_id = r.headers[JOB_HEADER]
            held = pool.submit(httpx.post, url, headers=ALICE, json=body, timeout=WAIT_S)
            queue = keys.queue(MODEL, "interactive", "alice")
            eventually(lambda: client.xlen(queue) == 2, "both jobs queued", WAIT_S)
            proc.send_signal(signal.SIGTERM)
            raw = r.read()  # the queued job's stream ends at once, not after the grace period
            refused = held.result()  # its headers were held: a 503 as if not streamed
        _, stderr = proc.communicate(timeout=WAIT_S)
        assert proc.returncode == 0, stderr.decode()
        assert stderr == b""  # nothing logged: no tracebacks, no cancelled tasks
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert b'"code":"gateway_shutting_down"' in raw
    assert raw.endswith(DONE)
    assert assert_error(refused, 503, "gateway_shutting_down")["type"] == "server_error"
    for job in (job_id, refused.headers[JOB_HEADER]):
        assert client.hget(keys.job(MODEL, job), "st") == b"cancelled"
    client.close()
