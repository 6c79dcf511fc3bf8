"""Every route that takes a body, fed hostile JSON (``tests/support/hostile.py``): nesting
depth to past the parser's limit, numbers past 64 bits and past a double, strings from
empty to past the body limit, unicode with NUL, bidi marks and lone surrogates. Each
answer is below 500 and each error an OpenAI error object.

The gateway runs on a real Redis with nobody dispatching. Its user's queue is full
before the run, so a body that passes every check goes through the whole submission
(payload, cost, the enqueue script) and is answered 429 instead of waiting for an
engine. A batch line is checked by the same code the batch worker runs per line.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from broker import JobQueue, Settings, Submission
from broker.batch.lines import KINDS, ValidLine, check_line
from broker.jobs import RequestKind, StreamMode
from broker.requests import engine_payload, estimate_cost
from tests.support.hostile import body
from tests.support.settings import ALICE, MODEL, make_settings
from tests.support.stack import gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

EXAMPLES = 120  # per route; derandomized, so every run sends the same bodies
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 8,
    "temperature": 0.5,
    "stream": False,
    "stream_options": {"include_usage": True},
    "user": "u",
    "stop": ["\n"],
    "n": 1,
}
CHAT_PLACES = [
    "model", "messages", "messages.0", "messages.0.content", "messages.0.role", "max_tokens",
    "temperature", "stream", "stream_options", "user", "stop", "n",
]  # fmt: skip
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 8, "echo": False, "logprobs": 1}
COMPLETION_PLACES = ["model", "prompt", "max_tokens", "echo", "logprobs"]
BATCH = {
    "input_file_id": "",  # the uploaded file's id
    "endpoint": "/v1/chat/completions",
    "completion_window": "24h",
    "metadata": {"k": "v"},
}
BATCH_PLACES = ["input_file_id", "endpoint", "completion_window", "metadata", "metadata.k"]
LINE = {"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": CHAT}
LINE_PLACES = ["custom_id", "method", "url", "body.+", *(f"body.{p}" for p in CHAT_PLACES)]
LINES = {
    "/v1/chat/completions": body(LINE, LINE_PLACES),
    "/v1/completions": body(
        LINE | {"url": "/v1/completions", "body": COMPLETION},
        ["custom_id", "url", "body.+", *(f"body.{p}" for p in COMPLETION_PLACES)],
    ),
}
HYPOTHESIS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def assert_answered(response: httpx.Response, sent: bytes) -> None:
    assert response.status_code < 500, (response.status_code, response.text, sent[:300])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str), error


@pytest.fixture
def gateway_settings(redis_url: str) -> Settings:
    return make_settings(redis_url, max_queued_per_user=1)


@pytest.fixture
def http(gateway_settings: Settings) -> Iterator[httpx.Client]:
    with (
        gateway(gateway_settings) as url,
        httpx.Client(base_url=url, headers=ALICE, timeout=10) as c,
    ):
        yield c


@pytest.fixture
async def full_queue(gateway_settings: Settings) -> None:
    """alice's one queued job: every request of hers that passes the checks gets 429."""
    redis = Redis.from_url(gateway_settings.require_redis_url())
    who = {"owner": "alice", "user": "alice", "tenant": "alice"}
    sub = Submission(model=MODEL, band="interactive", kind=RequestKind.CHAT,
                     stream_flag=StreamMode.PLAIN, payload=b"{}", **who)  # fmt: skip
    await JobQueue(redis, gateway_settings).submit(sub)
    await redis.aclose()


@pytest.mark.usefixtures("full_queue")
def test_hostile_completion_bodies_get_no_server_error(http: httpx.Client) -> None:
    statuses: set[int] = set()

    chats = body(CHAT, CHAT_PLACES).map(lambda b: ("/v1/chat/completions", b))
    completions = body(COMPLETION, COMPLETION_PLACES).map(lambda b: ("/v1/completions", b))

    @HYPOTHESIS
    @given(st.one_of(chats, completions))
    def post(request: tuple[str, bytes]) -> None:
        path, content = request
        response = http.post(path, content=content)
        statuses.add(response.status_code)
        assert_answered(response, content)

    post()
    assert {400, 429} <= statuses  # both refusals and bodies that passed every check
    assert http.get("/healthz").status_code == 200


def test_hostile_batch_bodies_and_files_get_no_server_error(http: httpx.Client) -> None:
    line = orjson.dumps(LINE | {"body": CHAT | {"stream": False}})
    uploaded = http.post("/v1/files", data={"purpose": "batch"},
                         files={"file": ("in.jsonl", io.BytesIO(line + b"\n"))})  # fmt: skip
    template = BATCH | {"input_file_id": uploaded.json()["id"]}
    statuses: set[int] = set()

    @HYPOTHESIS
    @given(body(template, BATCH_PLACES), body(LINE, LINE_PLACES), st.text(max_size=20))
    def post(batch: bytes, hostile_line: bytes, purpose: str) -> None:
        response = http.post("/v1/batches", content=batch)
        statuses.add(response.status_code)
        assert_answered(response, batch)
        upload = http.post("/v1/files", data={"purpose": purpose or "batch"},
                           files={"file": ("in.jsonl", io.BytesIO(hostile_line))})  # fmt: skip
        assert_answered(upload, hostile_line)

    post()
    assert {200, 400} <= statuses


@settings(HYPOTHESIS, max_examples=4 * EXAMPLES)  # no HTTP: cheap
@given(st.sampled_from(sorted(KINDS)).flatmap(lambda e: st.tuples(st.just(e), LINES[e])))
def test_a_hostile_batch_line_is_refused_or_queued_whole(line: tuple[str, bytes]) -> None:
    """What the batch worker does with each line: check it, then build its payload and
    cost; nothing of that may raise (a raise wedged the batch, issue 21)."""
    endpoint, raw = line
    checked = check_line(1, raw, endpoint, make_settings(), None)
    if isinstance(checked, ValidLine):
        engine_payload(checked.body, "job-1", checked.model)
        estimate_cost(checked.body, checked.model)
