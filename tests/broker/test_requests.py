"""Request bodies: what is checked, what passes through, what the engine receives."""

from __future__ import annotations

import orjson
import pytest

from broker import InvalidRequest, ModelConfig, RequestKind, StreamMode
from broker.requests import (
    MAX_DEPTH,
    engine_payload,
    estimate_cost,
    nests_deeper_than,
    parse_body,
    stream_mode,
    wants_usage,
)

VLLM = ModelConfig(name="m", endpoints=("http://engine:8000",))


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_valid_chat_body_is_returned_with_unknown_fields_intact() -> None:
    body = chat(temperature=0.2, logit_bias={"50256": -100}, stream=True)
    assert parse_body(RequestKind.CHAT, orjson.dumps(body)) == body


@pytest.mark.parametrize(
    ("kind", "body", "where"),
    [
        (RequestKind.CHAT, {"messages": [{"role": "user"}]}, "'model'"),
        (RequestKind.CHAT, {"model": "m"}, "'messages'"),
        (RequestKind.CHAT, chat(messages=[{"content": "no role"}]), "'messages.0.role'"),
        (RequestKind.CHAT, chat(stream="yes"), "'stream'"),
        (RequestKind.CHAT, chat(max_tokens=0), "'max_tokens'"),
        (RequestKind.CHAT, chat(user=42), "'user'"),
        (RequestKind.CHAT, chat(stream_options=["include_usage"]), "'stream_options'"),
        (RequestKind.COMPLETION, {"model": "m"}, "'prompt'"),
        (RequestKind.COMPLETION, {"model": "m", "prompt": {"text": "x"}}, "'prompt"),
    ],
)
def test_invalid_fields_are_named_in_the_error(
    kind: RequestKind, body: dict[str, object], where: str
) -> None:
    with pytest.raises(InvalidRequest, match=where):
        parse_body(kind, orjson.dumps(body))


@pytest.mark.parametrize("raw", [b"", b"{", b"nul", b"\xff"])
def test_non_json_is_an_invalid_request(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        parse_body(RequestKind.CHAT, raw)


def test_non_object_body_is_an_invalid_request() -> None:
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_body(RequestKind.CHAT, b'["m"]')


def test_vllm_payload_names_the_job_and_drops_the_fairness_user() -> None:
    payload = orjson.loads(engine_payload(chat(user="u1"), "job-1", VLLM))
    assert payload["request_id"] == "job-1"
    assert "user" not in payload


@pytest.mark.parametrize("engine", ["openai", "sglang", "tgi", "llamacpp"])
def test_engines_other_than_vllm_get_no_request_id(engine: str) -> None:
    model = ModelConfig.model_validate({"name": "m", "engine": engine, "endpoints": ["http://e"]})
    assert "request_id" not in orjson.loads(engine_payload(chat(), "job-1", model))


@pytest.mark.parametrize(
    ("engine", "admission"),
    [("sglang", "metrics"), ("llamacpp", "metrics"), ("tgi", "metrics"), ("openai", "static")],
)
def test_an_engine_with_metrics_fairq_reads_gets_metrics_admission(
    engine: str, admission: str
) -> None:
    model = ModelConfig.model_validate({"name": "m", "engine": engine, "endpoints": ["http://e"]})
    assert model.admission_policy == admission


def test_streams_always_ask_the_engine_for_usage_keeping_other_options() -> None:
    body = chat(stream=True, stream_options={"continuous_usage_stats": False})
    payload = orjson.loads(engine_payload(body, "job-1", VLLM))
    assert payload["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["stream_options"] == {"continuous_usage_stats": False}  # caller's body untouched
    assert not wants_usage(body)


def test_wants_usage_only_when_the_client_asked() -> None:
    assert wants_usage(chat(stream=True, stream_options={"include_usage": True}))
    assert not wants_usage(chat(stream=True, stream_options=None))
    assert not wants_usage(chat(stream=True))


def test_the_stream_mode_says_whether_the_answer_streams_and_ends_with_usage() -> None:
    usage = {"include_usage": True}
    assert stream_mode(chat(), VLLM) is StreamMode.WHOLE
    assert stream_mode(chat(stream=False, stream_options=usage), VLLM) is StreamMode.PLAIN
    assert stream_mode(chat(stream=True), VLLM) is StreamMode.STREAMED
    assert stream_mode(chat(stream=True, stream_options=usage), VLLM) is StreamMode.WITH_USAGE
    assert StreamMode.WITH_USAGE == "2"  # the wire value in Redis ('s')
    assert [m.to_client for m in StreamMode] == [False, True, True, False]
    assert [m.from_engine for m in StreamMode] == [False, True, True, True]


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"logprobs": True, "top_logprobs": 2},
        {"n": 2},
        {"echo": True},
        {"best_of": 2},
        {"return_token_ids": True},
        {"a_field_fairq_does_not_know": 1},
    ],
)
def test_a_whole_answer_the_worker_cannot_rebuild_goes_to_the_engine_as_sent(
    extra: dict[str, object],
) -> None:
    body = chat(**extra)
    assert stream_mode(body, VLLM) is StreamMode.PLAIN
    assert "stream" not in orjson.loads(engine_payload(body, "job-1", VLLM))


def test_a_whole_answer_is_streamed_from_the_engine_with_its_usage() -> None:
    body = chat(max_tokens=8, temperature=0.0, stop=["\n"], n=1, seed=3, stream=False)
    assert stream_mode(body, VLLM) is StreamMode.WHOLE
    payload = orjson.loads(engine_payload(body, "job-1", VLLM))
    assert payload["stream"] is True
    assert payload["stream_options"] == {"include_usage": True}


def test_a_model_may_keep_whole_answers_unstreamed() -> None:
    model = VLLM.model_copy(update={"stream_from_engine": False})
    assert stream_mode(chat(), model) is StreamMode.PLAIN
    assert "stream" not in orjson.loads(engine_payload(chat(), "job-1", model))


def test_a_client_cannot_set_its_own_engine_priority() -> None:
    body = {"model": "m", "prompt": "x", "priority": -100}
    assert "priority" not in orjson.loads(engine_payload(body, "job-1", VLLM))


def test_cost_estimate_weighs_prompt_and_requested_output() -> None:
    model = ModelConfig(name="m", endpoints=("http://e",), prompt_token_cost=1, output_token_cost=2)
    body = {"model": "m", "prompt": "x" * 398, "max_tokens": 50}  # 400 JSON bytes ~ 100 tokens
    assert estimate_cost(body, model) == 100 * 1 + 50 * 2
    no_max = {"model": "m", "prompt": "x" * 398}
    assert estimate_cost(no_max, model) == 100 + model.default_output_tokens * 2


def _nested(levels: int) -> bytes:
    """A chat body whose field ``x`` nests ``levels`` arrays (the body itself is one more)."""
    head = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":'
    return head + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize("levels", [MAX_DEPTH, MAX_DEPTH + 1, 254, 1023])
def test_a_body_fairq_could_not_serialise_again_is_refused_where_it_is_read(levels: int) -> None:
    raw = _nested(levels)
    if levels + 1 <= MAX_DEPTH:
        body = parse_body(RequestKind.CHAT, raw)
        assert orjson.loads(engine_payload(body, "j", VLLM))["x"] == orjson.loads(raw)["x"]
        assert estimate_cost(body, VLLM) > 0
        return
    with pytest.raises(InvalidRequest, match=f"more than {MAX_DEPTH} levels deep"):
        parse_body(RequestKind.CHAT, raw)


def test_the_deepest_body_accepted_is_served_downstream() -> None:
    body = parse_body(RequestKind.CHAT, _nested(MAX_DEPTH - 1))
    assert engine_payload(body, "j", VLLM).count(b"[") == MAX_DEPTH  # its arrays + messages


def test_nesting_is_counted_on_every_branch_without_recursion() -> None:
    deep: object = 1
    for _ in range(100_000):  # far past Python's recursion limit
        deep = {"a": [deep]}
    assert nests_deeper_than(deep, 10)
    assert not nests_deeper_than({"a": [1, {"b": []}], "c": {}}, 4)
    assert nests_deeper_than({"a": [1, {"b": []}], "c": {}}, 3)
    assert not nests_deeper_than("text", 0)


def test_resume_streams_is_exact_by_default_and_its_old_true_and_false_still_read() -> None:
    def mode(value: object) -> str:
        config = {"name": "m", "endpoints": ["http://e:1"], "resume_streams": value}
        return ModelConfig.model_validate(config).resume_streams

    assert VLLM.resume_streams == "exact"
    assert (mode(True), mode(False), mode("text")) == ("text", "off", "text")
    with pytest.raises(ValueError):
        mode("sometimes")
