"""The gateway sends an engine only the fields a model allows (``broker.engine_fields``):
an engine-private field such as vLLM's ``chat_template`` is a 400 naming the field and
the setting that allows it, before a job is made; a model whose ``allow_fields`` lists
a field queues a request that carries it. Through the official openai client, against
the gateway served as ``fairq api`` serves it (no engine: nothing here reaches one)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support.settings import ALICE_KEY, ENDPOINT, make_settings
from tests.support.stack import gateway

pytestmark = pytest.mark.integration

STRICT, ALLOWING = "strict-model", "allowing-model"
MODELS = [
    {"name": STRICT, "endpoints": [ENDPOINT]},
    {"name": ALLOWING, "endpoints": [ENDPOINT], "allow_fields": ["chat_template", "top_k"]},
]
EARLY = {"X-Fairq-Stream-Headers": "early"}  # the 200 as soon as the job is queued
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
def client(redis_url: str) -> Iterator[openai.OpenAI]:
    with gateway(make_settings(redis_url, models=MODELS)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key=ALICE_KEY, max_retries=0, timeout=10)


def test_a_chat_template_is_refused_with_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=STRICT,
            messages=MESSAGES,
            stream=True,
            extra_body={"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"},
            extra_headers=EARLY,
        )
    error = caught.value
    assert error.status_code == 400 and error.param == "chat_template"
    assert error.code == "field_not_allowed" and error.type == "invalid_request_error"
    assert "'chat_template'" in error.message and "allow_fields" in error.message


def test_an_engine_field_on_a_completion_is_refused_too(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(
            model=STRICT, prompt="hi", stream=True, extra_body={"top_k": 5}, extra_headers=EARLY
        )
    assert caught.value.param == "top_k"


def test_a_field_the_model_allows_is_queued(client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model=ALLOWING,
        messages=MESSAGES,
        stream=True,
        extra_body={"chat_template": "{{ messages }}", "top_k": 5},
        extra_headers=EARLY,
    ) as response:
        assert response.status_code == 200 and response.headers["x-fairq-job-id"]
