"""Going on with a streamed answer taken back out of the engine (workers.resume, pure): the
text its client has, the request for the rest, and usage counted once."""

from __future__ import annotations

import orjson

from broker import RequestKind
from broker.requests import resumable
from workers.engine import Accounting
from workers.resume import (
    Earlier,
    continuation,
    counted_once,
    drops_role_chunk,
    earlier_output,
)


def chat_chunk(content: str | None, finish: str | None = None, role: bool = False) -> bytes:
    delta: dict[str, str] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"id": "chatcmpl-j", "choices": [choice]}) + b"\n\n"


def test_the_earlier_text_and_tokens_come_from_the_chunks_the_client_got() -> None:
    chunks = [chat_chunk("", role=True) + chat_chunk("Hel"), chat_chunk("lo") + chat_chunk(",")]
    assert earlier_output(RequestKind.CHAT, chunks) == Earlier("Hello,", 3)
    text = b'data: {"choices":[{"index":0,"text":" once","finish_reason":null}]}\n\n'
    assert earlier_output(RequestKind.COMPLETION, [text]) == Earlier(" once", 1)


def test_a_chat_answer_goes_on_as_an_assistant_message_to_continue() -> None:
    payload = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
         "stream": True, "request_id": "j"}
    )  # fmt: skip
    body = orjson.loads(continuation(RequestKind.CHAT, payload, Earlier("Hello,", 3)) or b"")
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello,"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 7 and body["request_id"] == "j"


def test_a_completion_goes_on_from_its_prompt_and_text() -> None:
    payload = orjson.dumps({"prompt": "Once", "max_completion_tokens": 5, "min_tokens": 2})
    body = orjson.loads(continuation(RequestKind.COMPLETION, payload, Earlier(" upon", 2)) or b"")
    assert body == {"prompt": "Once upon", "max_completion_tokens": 3, "min_tokens": 0}


def test_nothing_is_asked_again_once_the_answer_ended_or_reached_its_limit() -> None:
    payload = orjson.dumps({"prompt": "x", "max_tokens": 2})
    assert continuation(RequestKind.COMPLETION, payload, Earlier("ab", 2)) is None
    assert continuation(RequestKind.COMPLETION, payload, Earlier("a", 1, "stop")) is None


def test_usage_counts_every_attempts_tokens_once() -> None:
    # The resumed attempt's prompt held the 3 earlier tokens, its completion 7 more.
    usage = counted_once({"prompt_tokens": 13, "completion_tokens": 7, "total_tokens": 20},
                         Earlier("Hello,", 3))  # fmt: skip
    assert usage == {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}


def test_the_usage_chunk_the_client_gets_is_counted_once() -> None:
    accounting = Accounting(earlier=Earlier("Hello,", 3))
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":13,"completion_tokens":7}}'
    out = accounting.scan(usage + b"\n\n", keep_usage=True)
    assert accounting.usage == {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}
    assert orjson.loads(out.strip()[6:])["usage"]["completion_tokens"] == 10


def test_a_resumed_chat_stream_drops_only_its_opening_role_chunk() -> None:
    events = chat_chunk("", role=True) + chat_chunk(" world")
    assert drops_role_chunk(events) == chat_chunk(" world")
    assert drops_role_chunk(chat_chunk(" more")) == chat_chunk(" more")


def test_outputs_that_cannot_go_on_where_they_were_cut_are_not_resumable() -> None:
    assert resumable(b'{"model":"m","messages":[],"stream":true}')
    assert resumable(b'{"model":"m","logprobs":false,"stop":null,"top_p":1}')
    for field in (
        b'"n":2', b'"tools":[]', b'"response_format":{}', b'"prompt":["a"]',
        b'"stop":"x"', b'"stop":["\\n"]',  # text held back: a continuation never sends it
        b'"logprobs":true', b'"logprobs":2', b'"top_logprobs":3',
        b'"return_token_ids":true',  # the client's own: the worker would take them out
        b'"stream_options":{"continuous_usage_stats":true}',
    ):  # fmt: skip
        assert not resumable(b'{"model":"m",' + field + b"}")
