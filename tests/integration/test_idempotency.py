"""``Idempotency-Key`` through the official ``openai`` client (``extra_headers``): a retry
gets the job its first try made (a stream replayed from its start or its
``Last-Event-ID``, a whole answer as it was), never a second one, across gateways and a
gateway's SIGKILL; the same key with another request is a 409 that says so; a bad key is
a 400; a key whose result expired is a 410. Files and batches likewise. Real Redis, the
simulator, gateways under uvicorn (one as a ``fairq api`` subprocess, to be killed), the
dispatcher and a worker in the test's loop; jobs are counted in Redis itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import hypothesis
import openai
import pytest
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk
from redis.asyncio import Redis

from broker import AsyncClient, JobQueue, RequestKind, StreamMode, Submission, keys
from broker.results import read_after
from fairq.stack.localredis import free_port
from sim import SimProfile
from tests.support.eventually import WAIT_S, aeventually
from tests.support.hostile import body as hostile_body
from tests.support.settings import ALICE, ALICE_KEY, MODEL, make_config, make_settings
from tests.support.stack import (
    WorkerProcesses,
    components,
    contents,
    job_field,
    sim,
)
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

MESSAGES: Any = [{"role": "user", "content": "hello"}]
KEY = "7d1c2a8e-0f4b-4c55-9a53-3b1e9f0c2d61"


@pytest.fixture
def engine() -> Iterator[str]:
    with sim() as url:
        yield url


@pytest.fixture
async def url(redis_url: str, engine: str) -> AsyncIterator[str]:
    """A gateway whose dispatcher and worker run in the test's loop."""
    settings = make_settings(redis_url, [engine], quick=True)
    with gateway_server(settings) as served:
        async with components(settings):
            yield served


def ai(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{url}/v1", api_key=ALICE_KEY, max_retries=0, timeout=WAIT_S
    )


def once(key: str = KEY) -> dict[str, str]:
    """What a client adds to a request to make it idempotent: one header."""
    return {"Idempotency-Key": key}


async def jobs(redis: Redis) -> list[str]:
    """The ids of every job Redis holds."""
    prefix = keys.job_prefix(MODEL)
    return [
        key.decode().removeprefix(prefix)
        async for key in redis.scan_iter(match=keys.job_pattern(MODEL))
    ]


async def the_answer(redis: Redis, job_id: str) -> list[str]:
    """The delta contents of the job's whole answer, as its worker wrote it to Redis."""
    events = await read_after(redis, MODEL, job_id, b"0-0")
    return contents(b"".join(event.chunk for event in events if event.chunk is not None))


def deltas(chunks: list[ChatCompletionChunk]) -> list[str]:
    return [
        c.choices[0].delta.content
        for c in chunks
        if c.choices and c.choices[0].delta.content is not None
    ]


async def test_a_retry_gets_the_first_tries_whole_answer_and_makes_no_second_job(
    url: str, aredis: Redis
) -> None:
    async with ai(url) as client:
        ask = client.chat.completions.with_raw_response.create
        first = await ask(model=MODEL, messages=MESSAGES, max_tokens=6, extra_headers=once())
        again = await ask(model=MODEL, messages=MESSAGES, max_tokens=6, extra_headers=once())
    assert again.parse().model_dump() == first.parse().model_dump()  # the same completion
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert await jobs(aredis) == [first.headers["x-fairq-job-id"]]


async def test_a_streamed_retry_replays_the_whole_stream_from_its_start(
    url: str, aredis: Redis
) -> None:
    async with ai(url) as client:
        streams = []
        for _ in range(2):
            stream = await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=12, stream=True, extra_headers=once()
            )
            streams.append([chunk async for chunk in stream])
    first, again = streams
    assert [c.model_dump() for c in again] == [c.model_dump() for c in first]
    (job_id,) = await jobs(aredis)
    assert deltas(again) == await the_answer(aredis, job_id) and len(deltas(again)) >= 12


async def test_a_streamed_retry_with_last_event_id_gets_exactly_the_events_after_it(
    url: str, aredis: Redis
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 10, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
        seen = await sse_events(http, body, once())
        rest = await sse_events(http, body, {**once(), "Last-Event-ID": seen[4][0]})
    assert rest == seen[5:] and rest[-1][1] == "[DONE]"
    assert len(await jobs(aredis)) == 1


async def sse_events(
    http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]
) -> list[tuple[str, str]]:
    """A streamed request's events, (id, data) in order."""
    events, event_id = [], ""
    async with http.stream(
        "POST", "/v1/chat/completions", json=body, headers={**ALICE, **headers}
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                events.append((event_id, line[6:]))
    return events


async def test_retries_at_once_through_two_gateways_make_one_job_and_all_get_its_answer(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True)
    with gateway_server(settings) as one, gateway_server(settings) as two:
        async with components(settings), ai(one) as first, ai(two) as second:
            answers = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=MODEL, messages=MESSAGES, max_tokens=8, extra_headers=once()
                    )
                    for client in (first, second) * 4
                )
            )
    assert len({answer.model_dump_json() for answer in answers}) == 1
    assert len(await jobs(aredis)) == 1


async def test_the_same_key_with_another_request_is_a_409_that_says_so_and_is_not_retried(
    url: str, aredis: Redis
) -> None:
    async with ai(url) as client:
        ask = client.chat.completions.create
        await ask(model=MODEL, messages=MESSAGES, max_tokens=4, extra_headers=once())
        with pytest.raises(openai.ConflictError) as refused:
            await ask(model=MODEL, messages=MESSAGES, max_tokens=5, extra_headers=once())
    error = refused.value
    assert error.status_code == 409 and error.code == "idempotency_key_reused"
    assert "used with a different request" in error.message and error.param is None
    assert error.response.headers["x-should-retry"] == "false"  # openai retries a 409 else
    assert len(await jobs(aredis)) == 1


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (b"", b"is empty"),
        (b"k" * 256, b"256 characters long"),
        (b"caf\xc3\xa9", b"non-ASCII"),
    ],
)
async def test_a_bad_key_is_a_400_that_says_what_a_key_must_be_and_makes_nothing(
    url: str, aredis: Redis, value: bytes, said: bytes
) -> None:
    body = {"model": MODEL, "messages": MESSAGES}
    async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
        headers = [(b"Authorization", ALICE["Authorization"].encode()), (b"Idempotency-Key", value)]
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
        twice = [*headers, (b"Idempotency-Key", b"other")] if value else headers
        doubled = await http.post("/v1/chat/completions", json=body, headers=twice)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_idempotency_key" and said.decode() in error["message"]
    assert "1 to 255 printable ASCII characters" in error["message"]
    if value:
        assert doubled.status_code == 400 and "one Idempotency-Key" in doubled.text
    assert await jobs(aredis) == []


async def test_a_retry_after_its_result_expired_is_a_410_naming_the_job_not_a_second_job(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True, result_ttl_s=1)
    with gateway_server(settings) as url:
        async with components(settings), ai(url) as client:
            ask = client.chat.completions.with_raw_response.create
            first = await ask(model=MODEL, messages=MESSAGES, max_tokens=3, extra_headers=once())
            job_id = first.headers["x-fairq-job-id"]
            await aeventually(lambda: _gone(aredis, job_id), "the job to expire", 5)
            with pytest.raises(openai.APIStatusError) as refused:
                await ask(model=MODEL, messages=MESSAGES, max_tokens=3, extra_headers=once())
    error = refused.value
    assert error.status_code == 410 and error.code == "idempotent_result_expired"
    assert job_id in error.message and "new key" in error.message
    assert await jobs(aredis) == []


async def _gone(redis: Redis, job_id: str) -> bool:
    return not await redis.exists(keys.job(MODEL, job_id))


async def test_the_python_client_and_the_gateway_share_a_keys_job(
    redis_url: str, url: str, aredis: Redis
) -> None:
    async with ai(url) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=4, extra_headers=once()
        )
    settings = make_settings(redis_url, quick=True)
    async with AsyncClient(settings, api_key=ALICE_KEY) as direct:
        job_id = await direct.submit(MODEL, messages=MESSAGES, max_tokens=4, idempotency_key=KEY)
    assert job_id == raw.headers["x-fairq-job-id"] and len(await jobs(aredis)) == 1


async def test_a_file_and_a_batch_are_made_once_per_key(url: str, aredis: Redis) -> None:
    line = b'{"custom_id": "1", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    async with ai(url) as client:
        upload = client.files.with_raw_response.create
        files = [
            await upload(file=("in.jsonl", line), purpose="batch", extra_headers=once())
            for _ in range(2)
        ]
        with pytest.raises(openai.ConflictError):
            await client.files.create(
                file=("in.jsonl", line * 2), purpose="batch", extra_headers=once()
            )
        file_id = files[0].parse().id
        create = client.batches.with_raw_response.create
        batches = [
            await create(
                input_file_id=file_id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                extra_headers=once("batch-1"),
            )
            for _ in range(2)
        ]
        with pytest.raises(openai.ConflictError):
            await client.batches.create(
                input_file_id=file_id,
                endpoint="/v1/completions",
                completion_window="24h",
                extra_headers=once("batch-1"),
            )
    assert files[1].parse().id == file_id and batches[1].parse().id == batches[0].parse().id
    assert [r.headers.get("idempotent-replayed") for r in (*files, *batches)] == [
        None,
        "true",
        None,
        "true",
    ]
    assert await aredis.zcard(keys.owner_files("alice")) == 1
    assert await aredis.zcard(keys.owner_batches("alice")) == 1


async def test_a_retry_on_another_gateway_after_a_sigkill_gets_every_token_once_of_one_job(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    """The fault: gateway A has queued the job and holds its response until the engine
    accepts it (no dispatcher runs yet, so it waits) when it is SIGKILLed. The client has
    nothing but a broken connection; it sends the request again, with its key, to gateway B,
    which follows the job A queued from its start."""
    settings = make_settings(redis_url, [engine], quick=True)
    procs = WorkerProcesses(make_config([engine], quick=True), redis_url)
    port = free_port()
    ask: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 40,
        "stream": True,
        "extra_headers": once(),
    }
    try:
        gateway_a = procs.spawn_gateway(port)
        async with ai(f"http://127.0.0.1:{port}") as doomed:
            call = asyncio.create_task(doomed.chat.completions.create(**ask))
            (job_id,) = await aeventually(lambda: jobs(aredis), "the job enqueued by gateway A")
            assert not call.done()  # enqueued, and its client has had no answer
            gateway_a.kill()  # SIGKILL
            gateway_a.wait(10)
            with pytest.raises(openai.APIConnectionError):
                await call
        assert await job_field(aredis, job_id, "st") == "queued"
        with gateway_server(settings) as gateway_b:
            async with ai(gateway_b) as client:
                retry = asyncio.create_task(client.chat.completions.create(**ask))
                # B follows the job (its connection took a generation) before it runs.
                await aeventually(lambda: job_field(aredis, job_id, "cx"), "B following the job")
                async with components(settings):
                    stream = await retry
                    received = [chunk async for chunk in stream]
    finally:
        procs.close()
    assert stream.response.headers["x-fairq-job-id"] == job_id
    assert stream.response.headers["idempotent-replayed"] == "true"
    answer = await the_answer(aredis, job_id)
    assert deltas(received) == answer  # every token, in order, each once
    assert len([token for token in answer if token]) == 40
    assert await jobs(aredis) == [job_id]  # one job: the one gateway A queued
    assert await job_field(aredis, job_id, "st") == "completed"


# Header bytes a client can send (h11's field-value: visible ASCII and obs-text, no DEL).
KEY_BYTES = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=300,
).map(lambda text: text.encode("latin-1"))
FEW = hypothesis.settings(
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)


async def test_hostile_bodies_and_keys_get_no_server_error(redis_url: str, aredis: Redis) -> None:
    """Every answer below 500, an OpenAI error object when refused: a body that passes
    every check meets a full queue (nobody dispatches), so it is answered 429 (or 409: its
    key was another body's)."""
    settings = make_settings(redis_url, max_queued_per_user=1)
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "stream": False}
    places = ["model", "messages", "messages.0.content", "max_tokens", "stream"]
    statuses: set[int] = set()
    await JobQueue(aredis, settings).submit(  # alice's one queued job: her queue is full
        Submission(
            model=MODEL,
            owner="alice",
            user="alice",
            tenant="alice",
            band="interactive",
            kind=RequestKind.CHAT,
            stream_flag=StreamMode.PLAIN,
            payload=b"{}",
        )
    )
    with gateway_server(settings) as url, httpx.Client(base_url=url, timeout=10) as http:
        upload = http.post(
            "/v1/files",
            data={"purpose": "batch"},
            headers=ALICE,
            files={"file": ("in.jsonl", b"{}\n")},
        )
        batch = {
            "input_file_id": upload.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }

        @FEW
        @hypothesis.given(
            hostile_body(chat, places),
            hostile_body(batch, list(batch)),
            st.one_of(KEY_BYTES, st.sampled_from([b"k-1", b"k-2"])),
        )
        def post(chat_body: bytes, batch_body: bytes, key: bytes) -> None:
            headers = [
                (b"Authorization", ALICE["Authorization"].encode()),
                (b"Idempotency-Key", key),
            ]
            for path, content in (("/v1/chat/completions", chat_body), ("/v1/batches", batch_body)):
                response = http.post(path, content=content, headers=headers)
                statuses.add(response.status_code)
                assert response.status_code < 500, (response.text, content[:200], key)
                if response.status_code >= 400:
                    assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        post()
    assert {200, 400, 429} <= statuses  # refused, and passed every check (batches: made)


SLOW = SimProfile(step_base_ms=8.0, step_per_seq_ms=0.05)  # ~120 tokens/s: time to leave


async def test_a_client_that_times_out_and_retries_gets_the_answer_its_job_ran_on_for(
    redis_url: str, aredis: Redis
) -> None:
    """The retry every client library makes: its first try gave up waiting (a read
    timeout closes the connection). A request without a key would have cancelled its job;
    one with a key keeps it for stream_resume_grace_s, and the retry takes it over."""
    with sim(SLOW) as engine:
        settings = make_settings(redis_url, [engine], quick=True)
        with gateway_server(settings) as url:
            async with components(settings):
                hasty = openai.AsyncOpenAI(
                    base_url=f"{url}/v1", api_key=ALICE_KEY, max_retries=0, timeout=0.3
                )
                async with hasty, ai(url) as patient:
                    ask: dict[str, Any] = {
                        "model": MODEL,
                        "messages": MESSAGES,
                        "max_tokens": 120,
                        "extra_headers": once(),
                    }
                    with pytest.raises(openai.APITimeoutError):
                        await hasty.chat.completions.create(**ask)
                    answer = await patient.chat.completions.with_raw_response.create(**ask)
    (job_id,) = await jobs(aredis)
    assert answer.headers["x-fairq-job-id"] == job_id
    assert answer.headers["idempotent-replayed"] == "true"
    assert answer.parse().usage is not None and answer.parse().usage.completion_tokens == 120
    assert await job_field(aredis, job_id, "st") == "completed"


async def test_a_client_with_a_key_that_leaves_and_never_retries_is_cancelled_after_the_grace(
    redis_url: str, aredis: Redis
) -> None:
    with sim(SLOW) as engine:
        settings = make_settings(redis_url, [engine], quick=True, stream_resume_grace_s=0.3)
        with gateway_server(settings) as url:
            async with components(settings), ai(url) as client:
                stream = await client.chat.completions.create(
                    model=MODEL,
                    messages=MESSAGES,
                    max_tokens=2000,
                    stream=True,
                    extra_headers=once(),
                )
                job_id = stream.response.headers["x-fairq-job-id"]
                await stream.close()
                await aeventually(
                    lambda: job_field(aredis, job_id, "st"),
                    "the cancel",
                    until=lambda state: state == "cancelled",
                )
