"""Which request fields may reach the engine (``broker.engine_fields``): OpenAI's of the
request's kind, fairq's own, and those the model's ``allow_fields`` lists; any other is
refused with a 400 naming it, in the Python client and on a batch line (alone)."""

from __future__ import annotations

import orjson
import pytest
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params
from pydantic import ValidationError
from redis.asyncio import Redis

from broker import AsyncClient, InvalidRequest, ModelConfig, RequestKind
from broker.batch.lines import LineError, ValidLine, check_line
from broker.engine_fields import FAIRQ_FIELDS, OPENAI_FIELDS, check_fields
from broker.requests import engine_payload
from tests.support.settings import ALICE_KEY, MODEL, make_settings

ENGINE = ("http://engine:8000",)
DEFAULT = ModelConfig(name="m", endpoints=ENGINE)
# vLLM's own request fields (its protocol's extra and sampling params), and the
# simulator's: none is OpenAI's, so none passes by default.
ENGINE_PRIVATE = [
    "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "logits_processors",
    "kv_transfer_params", "vllm_xargs", "guided_json", "structured_outputs", "top_k",
    "min_p", "ignore_eos", "return_token_ids", "request_id", "add_generation_prompt",
    "documents", "cache_salt", "sim_fault",
]  # fmt: skip
CHAT: dict[str, object] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION: dict[str, object] = {"model": "m", "prompt": "hi"}
EMBEDDING: dict[str, object] = {"model": "m", "input": "hi"}
RESPONSE: dict[str, object] = {"model": "m", "input": "hi"}
BODIES: dict[RequestKind, dict[str, object]] = {
    RequestKind.CHAT: CHAT,
    RequestKind.COMPLETION: COMPLETION,
    RequestKind.EMBEDDING: EMBEDDING,
    RequestKind.RESPONSE: RESPONSE,
}
SDK_PARAMS: dict[RequestKind, type] = {
    RequestKind.CHAT: chat_create_params.CompletionCreateParamsBase,
    RequestKind.COMPLETION: completion_create_params.CompletionCreateParamsBase,
    RequestKind.EMBEDDING: embedding_create_params.EmbeddingCreateParams,
    RequestKind.RESPONSE: response_create_params.ResponseCreateParamsBase,
}


def sdk_fields(kind: RequestKind) -> set[str]:
    """The request fields of the official openai SDK's ``create`` for ``kind``."""
    return {*SDK_PARAMS[kind].__annotations__, "stream"}


def refusal(kind: RequestKind, body: dict[str, object], model: ModelConfig) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        check_fields(kind, body, model)
    return caught.value


@pytest.mark.parametrize("kind", list(RequestKind))
def test_every_field_passed_by_default_is_one_of_openais(kind: RequestKind) -> None:
    assert OPENAI_FIELDS[kind] <= sdk_fields(kind)
    if kind.generates:
        assert {"model", "stream", "max_tokens", "temperature", "top_p", "stop", "seed"} <= (
            OPENAI_FIELDS[kind]
        )


def test_the_defaults_hold_the_sampling_and_output_fields_of_each_kind() -> None:
    chat = {"messages", "max_completion_tokens", "n", "presence_penalty", "frequency_penalty",
            "logit_bias", "logprobs", "top_logprobs", "stream_options", "response_format",
            "tools", "tool_choice", "parallel_tool_calls", "user"}  # fmt: skip
    assert chat <= OPENAI_FIELDS[RequestKind.CHAT]
    assert {"prompt", "echo", "suffix", "best_of", "logprobs"} <= OPENAI_FIELDS[
        RequestKind.COMPLETION
    ]
    # What asks a server for more than generating stays out: storage, search, audio.
    left_out = {"store", "metadata", "web_search_options", "audio", "modalities"}
    assert not left_out & OPENAI_FIELDS[RequestKind.CHAT]


@pytest.mark.parametrize("kind", [kind for kind in RequestKind if kind.generates])
def test_an_openai_body_with_fairqs_own_fields_passes(kind: RequestKind) -> None:
    body = {**BODIES[kind], "temperature": 0.2, "stream": True, "user": "u", "n": 1,
            "stream_options": {"include_usage": True}, "service_tier": "flex",
            "priority": 3}  # fmt: skip
    assert {"service_tier", "priority"} <= FAIRQ_FIELDS
    check_fields(kind, body, DEFAULT)


def test_an_embedding_takes_openais_fields_and_fairqs_but_not_generation_ones() -> None:
    body = {**EMBEDDING, "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8,
            "user": "u", "service_tier": "flex", "priority": 3}  # fmt: skip
    check_fields(RequestKind.EMBEDDING, body, DEFAULT)
    assert refusal(RequestKind.EMBEDDING, {**EMBEDDING, "stream": True}, DEFAULT).param == "stream"
    assert refusal(RequestKind.EMBEDDING, {**EMBEDDING, "max_tokens": 1}, DEFAULT).param == (
        "max_tokens"
    )


def test_a_response_takes_store_false_only_and_no_stored_state_unless_allowed() -> None:
    body = {**RESPONSE, "instructions": "be brief", "max_output_tokens": 9, "stream": True,
            "tools": [], "reasoning": {"effort": "low"}, "store": False}  # fmt: skip
    check_fields(RequestKind.RESPONSE, body, DEFAULT)
    stored_state = [("store", True), ("previous_response_id", "resp_1"), ("background", True),
                    ("conversation", "c"), ("max_tokens", 5)]  # fmt: skip
    for field, value in stored_state:
        refused = refusal(RequestKind.RESPONSE, {**RESPONSE, field: value}, DEFAULT)
        assert refused.param == field and "Responses API" in refused.to_body()["error"]["message"]
    stored = DEFAULT.model_copy(update={"allow_fields": ("store", "previous_response_id")})
    check_fields(
        RequestKind.RESPONSE, {**RESPONSE, "store": True, "previous_response_id": "r"}, stored
    )


def test_a_response_asks_the_engine_to_store_nothing_unless_the_client_may() -> None:
    vllm = DEFAULT.model_copy(update={"engine": "vllm"})
    payload = orjson.loads(
        engine_payload({**RESPONSE, "stream": True}, "j", vllm, RequestKind.RESPONSE)
    )
    assert payload["store"] is False and payload["request_id"] == "resp_j"
    assert "stream_options" not in payload  # its usage comes in response.completed
    kept = engine_payload({**RESPONSE, "store": True}, "j", vllm, RequestKind.RESPONSE)
    assert orjson.loads(kept)["store"] is True


@pytest.mark.parametrize("field", ENGINE_PRIVATE)
def test_an_engine_private_field_is_refused_naming_it_and_how_to_allow_it(field: str) -> None:
    error = refusal(RequestKind.CHAT, {**CHAT, field: "x"}, DEFAULT)
    body = error.to_body()["error"]
    assert error.status == 400 and body["type"] == "invalid_request_error"
    assert body["param"] == field and body["code"] == "field_not_allowed"
    message = body["message"] or ""
    assert repr(field) in message and "'m'" in message and "allow_fields" in message


def test_a_field_of_the_other_kind_is_refused() -> None:
    assert refusal(RequestKind.CHAT, {**CHAT, "echo": True}, DEFAULT).param == "echo"
    assert refusal(RequestKind.COMPLETION, {**COMPLETION, "tools": []}, DEFAULT).param == "tools"


def test_a_field_the_model_allows_passes_and_only_on_that_model() -> None:
    allowing = ModelConfig(name="sim", endpoints=ENGINE, allow_fields=("sim_fault", "top_k"))
    body = {**CHAT, "sim_fault": {"kind": "cut"}, "top_k": 5}
    check_fields(RequestKind.CHAT, body, allowing)
    check_fields(RequestKind.COMPLETION, {**COMPLETION, "top_k": 5}, allowing)
    assert orjson.loads(engine_payload(body, "job-1", allowing))["sim_fault"] == {"kind": "cut"}
    assert refusal(RequestKind.CHAT, body, DEFAULT).param == "sim_fault"


def test_several_refused_fields_are_named_up_to_three_and_counted() -> None:
    body = {**CHAT, **dict.fromkeys(["a", "b", "c", "d", "e"], 1)}
    error = refusal(RequestKind.CHAT, body, DEFAULT)
    assert error.param == "a"
    assert "'a', 'b', 'c' and 2 more are not allowed" in error.message


def test_a_long_field_name_is_not_repeated_whole() -> None:
    name = "x" * 10_000
    error = refusal(RequestKind.CHAT, {**CHAT, name: 1}, DEFAULT)
    assert len(error.message) < 500 and error.param is not None and len(error.param) < 100


@pytest.mark.parametrize("names", [[""], [" top_k"], "top_k"])
def test_allow_fields_takes_a_list_of_field_names(names: object) -> None:
    with pytest.raises(ValidationError, match="allow_fields"):
        ModelConfig(name="m", endpoints=ENGINE, allow_fields=names)  # type: ignore[arg-type]


def batch_line(number: int, **extra: object) -> bytes:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, **extra}
    line = {"custom_id": f"c{number}", "method": "POST", "url": "/v1/completions", "body": body}
    return orjson.dumps(line)


def test_a_batch_line_with_a_field_not_allowed_fails_alone() -> None:
    settings = make_settings()
    lines = [batch_line(1), batch_line(2, chat_template="{{ 7*7 }}"), batch_line(3, seed=1)]
    checked = [
        check_line(n, raw, "/v1/completions", settings, None) for n, raw in enumerate(lines, 1)
    ]
    assert [type(c) for c in checked] == [ValidLine, LineError, ValidLine]
    error = checked[1]
    assert isinstance(error, LineError)
    assert (error.code, error.custom_id) == ("field_not_allowed", "c2")
    assert error.message.startswith("line 2: the request field 'chat_template' is not allowed")


def test_a_batch_line_passes_a_field_its_model_allows() -> None:
    settings = make_settings(model_fields={"allow_fields": ["chat_template"]})
    raw = batch_line(1, chat_template="x")
    assert isinstance(check_line(1, raw, "/v1/completions", settings, None), ValidLine)


async def test_the_python_client_refuses_a_field_not_allowed_before_queueing(
    redis_url: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url)
    async with AsyncClient(settings, api_key=ALICE_KEY) as client:
        with pytest.raises(InvalidRequest, match="allow_fields") as caught:
            await client.submit(MODEL, prompt="hi", chat_template="{{ 7*7 }}")
        assert caught.value.param == "chat_template"
    assert await aredis.dbsize() == 0  # no job, no queue entry
