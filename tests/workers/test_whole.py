"""A whole answer rebuilt from the engine's stream (pure): vLLM's own captured streams."""

from __future__ import annotations

import orjson
import pytest

from broker import RequestKind
from tests.support.paths import FIXTURES
from workers.engine import Accounting
from workers.whole import WholeAnswer

VLLM = FIXTURES / "vllm-0.32-cpu"


def _events(name: str) -> list[bytes]:
    """The capture's body, cut into the events the worker's reader hands on."""
    body = (VLLM / name).read_bytes().split(b"\r\n\r\n", 1)[1]  # after the headers
    return [event + b"\n\n" for event in body.split(b"\n\n") if event.strip()]


def _rebuilt(name: str, kind: RequestKind) -> tuple[dict[str, object], list[dict[str, object]]]:
    accounting, answer = Accounting(), WholeAnswer(kind)
    for event in _events(name):  # one event per read, as the engine sends them
        answer.add(accounting.scan(event, keep_usage=True))
    chunks = [orjson.loads(e[6:]) for e in _events(name) if e.startswith(b"data: {")]
    return orjson.loads(answer.body(accounting.usage)), chunks


def test_a_chat_answer_is_its_deltas_joined_with_the_last_finish_reason_and_usage() -> None:
    body, chunks = _rebuilt("sse_sample_with_headers_chat.txt", RequestKind.CHAT)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text  # the capture has an answer to rebuild
    assert body == {
        "id": chunks[0]["id"],
        "object": "chat.completion",
        "created": chunks[0]["created"],
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        ],
        "system_fingerprint": chunks[-1]["system_fingerprint"],
        "usage": {"prompt_tokens": 8, "total_tokens": 12, "completion_tokens": 4},
    }


def test_a_completion_is_its_texts_joined() -> None:
    body, chunks = _rebuilt("sse_sample_with_headers_completions.txt", RequestKind.COMPLETION)
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert body["object"] == "text_completion"
    assert body["choices"] == [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
    ]
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4}


def test_events_read_several_at_once_give_the_same_answer() -> None:
    one_by_one, _ = _rebuilt("sse_sample_with_headers_chat.txt", RequestKind.CHAT)
    accounting, answer = Accounting(), WholeAnswer(RequestKind.CHAT)
    answer.add(accounting.scan(b"".join(_events("sse_sample_with_headers_chat.txt")), True))
    assert orjson.loads(answer.body(accounting.usage)) == one_by_one


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_streamed_beside_the_content_is_kept_in_the_message(field: str) -> None:
    answer = WholeAnswer(RequestKind.CHAT)
    deltas = [{"role": "assistant", field: "think"}, {field: "ing"}, {"content": "42"}]
    for delta in deltas:
        chunk = {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": delta}]}
        answer.add(b"data: " + orjson.dumps(chunk) + b"\n\n")
    message = orjson.loads(answer.body(None))["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "42", field: "thinking"}


def test_an_answer_with_no_text_keeps_content_null_as_the_engine_would() -> None:
    answer = WholeAnswer(RequestKind.CHAT)
    chunk = {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {}}]}
    answer.add(b"data: " + orjson.dumps(chunk) + b"\n\n")
    assert orjson.loads(answer.body(None))["choices"][0]["message"]["content"] is None


def test_a_long_completion_keeps_every_piece_in_order() -> None:
    answer = WholeAnswer(RequestKind.COMPLETION)
    pieces = [f" w{i}" for i in range(5000)]
    for piece in pieces:
        chunk = {"id": "c", "created": 1, "model": "m", "choices": [{"index": 0, "text": piece}]}
        answer.add(b"data: " + orjson.dumps(chunk) + b"\n\n")
    assert orjson.loads(answer.body(None))["choices"][0]["text"] == "".join(pieces)
