"""OpenAI's ``param``: the request field at fault, named as OpenAI names it, or null."""

from __future__ import annotations

import orjson
import pytest

from broker import InvalidRequest, RequestKind
from broker.errors import FairqError, Forbidden, QueueFull
from broker.requests import parse_body


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        (RequestKind.CHAT, {"messages": [{"role": "user"}]}, "model"),
        (RequestKind.CHAT, chat(model=""), "model"),
        (RequestKind.CHAT, {"model": "m"}, "messages"),
        (RequestKind.CHAT, chat(messages=[]), "messages"),
        (RequestKind.CHAT, chat(messages=[{"content": "no role"}]), "messages.[0].role"),
        # A union's member (content.str, content.list[...]) is no field of the body.
        (
            RequestKind.CHAT,
            chat(messages=[{"role": "u"}, {"role": "u", "content": 5}]),
            "messages.[1].content",
        ),
        (RequestKind.CHAT, chat(messages=[{"role": "u", "content": [7]}]), "messages.[0].content"),
        (RequestKind.CHAT, chat(max_tokens=0), "max_tokens"),
        (RequestKind.CHAT, chat(max_completion_tokens="9"), "max_completion_tokens"),
        (RequestKind.CHAT, chat(stream="yes"), "stream"),
        (RequestKind.CHAT, chat(stream_options=["include_usage"]), "stream_options"),
        (RequestKind.COMPLETION, {"model": "m"}, "prompt"),
        (RequestKind.COMPLETION, {"model": "m", "prompt": {"text": "x"}}, "prompt"),
        (RequestKind.COMPLETION, {"model": "m", "prompt": [1, "a"]}, "prompt"),
    ],
)
def test_a_field_at_fault_is_named_in_param(
    kind: RequestKind, body: dict[str, object], param: str
) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_body(kind, orjson.dumps(body))
    assert raised.value.param == param
    assert raised.value.to_body()["error"]["param"] == param


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"[" * 200 + b"]" * 200])
def test_a_body_that_is_wrong_as_a_whole_has_no_param(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_body(RequestKind.CHAT, raw)
    assert raised.value.param is None


def test_every_error_object_has_openais_four_fields_in_openais_order() -> None:
    for error in (
        FairqError("boom"),
        Forbidden("not yours"),
        QueueFull("full", retry_after_s=1),
        InvalidRequest("bad", param="n", code="invalid_n"),
    ):
        assert list(error.to_body()["error"]) == ["message", "type", "param", "code"]
    assert InvalidRequest("bad", param="n").to_body()["error"]["param"] == "n"
