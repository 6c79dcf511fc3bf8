"""OpenAI-shaped errors on every path, as the official ``openai`` client sees them.

A real stack of processes (``fairq up``'s, on free ports, the simulator standing in for
vLLM): a streamed request that fails before its first token gets the status and error
object of the same request not streamed, ``param`` names the request field at fault,
and the priority band header is a 400 when unknown and a 403 when not the key's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from fairq.stack.localredis import LocalRedis
from fairq.stack.processes import DEMO_MODELS, Stack, demo_api_keys
from tests.support.settings import SIM_FAULTS, api_key
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

MODEL = DEMO_MODELS[0]
BATCH_ONLY_KEY = "fq-test-batch-only"
TOO_MANY = 100_000  # output tokens: beyond the simulator's 4,096-token context
EARLY = {"X-Fairq-Stream-Headers": "early"}

Call = Callable[..., Any]


@pytest.fixture(scope="module")
def stack(redis_server: LocalRedis) -> Iterator[Stack]:
    keys = [*demo_api_keys(), api_key(BATCH_ONLY_KEY, "carol", bands=["batch"])]
    with demo_stack(
        redis_url=redis_server.url, overrides={"api_keys": keys}, per_model={MODEL: SIM_FAULTS}
    ) as running:
        yield running


def client(stack: Stack, key: str = "fq-demo-alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=key, max_retries=0, timeout=10)


def chat(ai: openai.OpenAI) -> Call:
    def call(**extra: Any) -> Any:
        fields = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
        return ai.chat.completions.create(**fields)

    return call


def legacy(ai: openai.OpenAI) -> Call:
    def call(**extra: Any) -> Any:
        return ai.completions.create(model=MODEL, prompt="hi", **extra)

    return call


def refusal(call: Call, **extra: Any) -> openai.APIStatusError:
    """The error that ``call`` raises at once, before any stream is read."""
    with pytest.raises(openai.APIStatusError) as raised:
        call(**extra)
    return raised.value


@pytest.mark.parametrize("endpoint", [chat, legacy], ids=["chat", "completions"])
def test_a_stream_the_engine_refuses_raises_the_same_bad_request_as_unstreamed(
    stack: Stack, endpoint: Callable[[openai.OpenAI], Call]
) -> None:
    with client(stack) as ai:
        call = endpoint(ai)
        plain = refusal(call, max_tokens=TOO_MANY)
        streamed = refusal(call, max_tokens=TOO_MANY, stream=True)
    assert isinstance(streamed, openai.BadRequestError), streamed
    assert streamed.status_code == plain.status_code == 400
    assert streamed.body == plain.body  # the whole error object, message included
    assert (streamed.type, streamed.param, streamed.code) == (
        "invalid_request_error",
        "max_tokens",  # the simulator names it as vLLM does; fairq passes it on
        "engine_http_400",
    )
    assert f"is too large: {TOO_MANY}" in streamed.message
    for error in (plain, streamed):
        assert error.response.headers["content-type"] == "application/json"
        assert error.response.headers["x-fairq-job-id"]


def test_with_early_headers_the_same_refusal_comes_as_an_error_event(stack: Stack) -> None:
    with client(stack) as ai:
        plain = refusal(chat(ai), max_tokens=TOO_MANY)
        stream = chat(ai)(max_tokens=TOO_MANY, stream=True, extra_headers=EARLY)
        with pytest.raises(openai.APIError) as raised:
            list(stream)
    assert not isinstance(raised.value, openai.APIStatusError)  # it had its 200
    assert raised.value.body == plain.body


def test_a_stream_that_succeeds_is_unchanged_by_the_held_headers(stack: Stack) -> None:
    with client(stack) as ai:
        response = ai.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        chunks = list(response.parse())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert chunks[0].id == f"chatcmpl-{response.headers['x-fairq-job-id']}"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 4


def test_held_headers_leave_when_the_engine_accepts_not_with_the_first_token(
    stack: Stack,
) -> None:
    """The simulator answers 200 at once and then holds the first token back (a slow
    prefill): the client has its headers long before that token."""
    pause_s = 1.5
    fault = {"kind": "hang", "after_tokens": 0, "hang_s": pause_s}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": True, "sim_fault": fault}  # fmt: skip
    headers = {"Authorization": "Bearer fq-demo-alice"}
    with httpx.Client(base_url=stack.gateway_url, timeout=10) as http:
        sent = time.monotonic()
        with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as reply:
            headers_s = time.monotonic() - sent
            lines = reply.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            first_s = time.monotonic() - sent
            rest = [line for line in lines if line.startswith("data: ")]
    assert reply.status_code == 200 and "chat.completion.chunk" in first
    assert rest[-1] == "data: [DONE]"
    assert first_s >= pause_s
    assert headers_s < pause_s / 2, (headers_s, first_s)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.[0].content"),
        ({"messages": [{"content": "hi"}]}, "messages.[0].role"),
        ({"stream_options": "yes", "stream": True}, "stream_options"),
    ],
    ids=["max_tokens", "content", "missing-role", "stream_options"],
)
def test_a_field_the_gateway_refuses_is_named_in_param(
    stack: Stack, extra: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    with client(stack) as ai:
        refused = refusal(lambda: ai.post("/chat/completions", body=body, cast_to=object))
    assert isinstance(refused, openai.BadRequestError)
    assert (refused.param, refused.code) == (param, "invalid_request")


def test_an_unknown_model_is_a_404_naming_the_model(stack: Stack) -> None:
    with client(stack) as ai:
        for stream in (False, True):
            refused = refusal(chat(ai), model="no-such-model", stream=stream)
            assert isinstance(refused, openai.NotFoundError)
            assert (refused.param, refused.code) == ("model", "model_not_found")


def test_an_unknown_band_is_a_400_and_a_band_not_the_keys_a_403(stack: Stack) -> None:
    with client(stack) as alice, client(stack, BATCH_ONLY_KEY) as carol:
        for stream in (False, True):
            unknown = refusal(chat(alice), stream=stream, extra_headers={"X-Fairq-Band": "vip"})
            assert isinstance(unknown, openai.BadRequestError)
            assert (unknown.code, unknown.param) == ("unknown_band", None)
            denied = refusal(
                chat(carol), stream=stream, extra_headers={"X-Fairq-Band": "interactive"}
            )
            assert isinstance(denied, openai.PermissionDeniedError)
            assert (denied.code, denied.param) == ("permission_denied", None)
        served = chat(carol)(max_tokens=2, extra_headers={"X-Fairq-Band": "batch"})
    assert served.usage is not None and served.usage.completion_tokens == 2
