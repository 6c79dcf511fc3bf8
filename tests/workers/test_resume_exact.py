"""Going on with a streamed answer exactly where it was cut, from token ids (pure parts:
workers.token_ids, workers.resume_exact, workers.attempt), on hand-made cases and on
chunks of vLLM 0.32 with ``return_token_ids`` captured from the real engine."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from broker import Claimed, RequestKind, StreamMode, TokenTrail, WrittenEntry
from workers import attempt
from workers.resume import Earlier
from workers.resume_exact import (
    Ident,
    Reshaper,
    Seam,
    needs_context_len,
    owed_usage,
    seam_of,
    token_continuation,
)
from workers.token_ids import asking_token_ids, parse_groups, take_token_ids

# vLLM 0.32 (CPU, tiny model), a chat stream with and without return_token_ids.
HEAD_IDS = (
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":17,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":[4,204,2847,336,2,204,5,204],'
    b'"prompt_text":null}\n\n'
)
HEAD = HEAD_IDS.replace(b"[4,204,2847,336,2,204,5,204]", b"null")
TOKEN_IDS = (
    b'data: {"id":"chatcmpl-9","object":"chat.completion.chunk","created":17,"model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":" level"},"logprobs":null,'
    b'"finish_reason":null,"token_ids":[1573]}]}\n\n'
)
TOKEN = TOKEN_IDS.replace(b"[1573]", b"null")
# A completion's first chunk carries the prompt's ids in its choice.
FIRST_IDS = (
    b'data: {"id":"cmpl-b","object":"text_completion","created":17,"model":"tiny","choices":'
    b'[{"index":0,"text":" as","logprobs":null,"finish_reason":null,"stop_reason":null,'
    b'"prompt_token_ids":[321,286,13],"token_ids":[459]}]}\n\n'
)
FIRST = FIRST_IDS.replace(b"[321,286,13]", b"null").replace(b"[459]", b"null")
IDENT = Ident("chatcmpl-9", 17, "tiny")


def chat(content: str, finish: str | None = None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": content}, "logprobs": None,
                              "finish_reason": finish, "token_ids": None}  # fmt: skip
    event = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 17,
             "model": "tiny", "choices": [choice]}  # fmt: skip
    return b"data: " + orjson.dumps(event) + b"\n\n"


def completion(text: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
              "stop_reason": None, "prompt_token_ids": None, "token_ids": ids}  # fmt: skip
    event = {"id": "cmpl-x", "object": "text_completion", "created": 99, "model": "tiny",
             "choices": [choice]}  # fmt: skip
    return b"data: " + orjson.dumps(event) + b"\n\n"


def usage(prompt: int, done: int) -> bytes:
    event = {"id": "cmpl-x", "object": "text_completion", "created": 99, "model": "tiny",
             "choices": [], "usage": {"prompt_tokens": prompt, "total_tokens": prompt + done,
             "completion_tokens": done}, "system_fingerprint": "vllm-0.32.0-6c"}  # fmt: skip
    return b"data: " + orjson.dumps(event) + b"\n\n"


def job(payload: dict[str, Any], kind: RequestKind = RequestKind.CHAT) -> Claimed:
    return Claimed("m", b"1-0", "j", orjson.dumps(payload), kind, StreamMode.WITH_USAGE,
                   "http://e:8000", "default", "alice", resume_gen=1,
                   track_tokens=True)  # fmt: skip


# --- the first attempt: token ids out of the client's chunks, into the trail ------------


def test_the_client_gets_exactly_the_bytes_vllm_sends_without_token_ids() -> None:
    events, trail = take_token_ids(HEAD_IDS + TOKEN_IDS)
    assert events == HEAD + TOKEN
    assert trail == TokenTrail(b"1573", b"4,204,2847,336,2,204,5,204")
    events, trail = take_token_ids(FIRST_IDS)
    assert events == FIRST
    assert trail == TokenTrail(b"459", b"321,286,13")


def test_every_event_keeps_its_own_group_of_ids() -> None:
    two = TOKEN_IDS + TOKEN_IDS.replace(b"[1573]", b"[7,8]")
    events, trail = take_token_ids(two)
    assert events == TOKEN + TOKEN
    assert parse_groups(trail.tokens) == [[1573], [7, 8]]
    assert take_token_ids(TOKEN) == (TOKEN, TokenTrail())  # an engine that gave none


def test_the_request_asks_for_token_ids() -> None:
    payload = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "{x}"}]})
    assert orjson.loads(asking_token_ids(payload)) == {
        "return_token_ids": True, **orjson.loads(payload)
    }  # fmt: skip


def test_a_resumable_job_asks_for_token_ids_and_others_do_not() -> None:
    plan = attempt.fresh(job({"model": "m", "stream": True}))
    assert plan.url == "http://e:8000/v1/chat/completions" and plan.shape is take_token_ids
    assert b'"return_token_ids":true' in plan.payload
    plain = attempt.fresh(Claimed("m", b"1-0", "j", b"{}", RequestKind.CHAT, StreamMode.STREAMED,
                                  "http://e:8000", "default", "alice"))  # fmt: skip
    assert plain.payload == b"{}" and plain.shape is None


# --- the seam: where the answer goes on ------------------------------------------------


def test_the_seam_is_the_prompt_and_every_token_the_client_has() -> None:
    entries = [
        WrittenEntry(HEAD + chat(" a"), TokenTrail(b"11", b"1,2,3")),
        WrittenEntry(chat(" b") + chat(" c"), TokenTrail(b"12;13,14")),
    ]
    assert seam_of(RequestKind.CHAT, entries) == Seam([1, 2, 3], [11, 12, 13, 14], 0, IDENT)


def test_tokens_whose_text_was_held_back_are_generated_again() -> None:
    # vLLM sends a token that ends inside a character with empty text: the engine must
    # not go on from it (its detokenizer would start mid-character).
    entries = [WrittenEntry(HEAD + chat(" a") + chat("") + chat(""), TokenTrail(b"11;12;13", b"1"))]
    seam = seam_of(RequestKind.CHAT, entries)
    assert seam is not None and seam.kept == [11] and seam.redone == 2
    # A later resume drops them again: the attempt after the cut generated them anew.
    later = [*entries, WrittenEntry(chat("é") + chat(" b"), TokenTrail(b"20;21", redone=2))]
    assert seam_of(RequestKind.CHAT, later) == Seam([1], [11, 20, 21], 0, IDENT)


@pytest.mark.parametrize(
    "entries",
    [
        [WrittenEntry(HEAD + chat(" a"), TokenTrail(b"11"))],  # no prompt ids: not vLLM's
        [WrittenEntry(HEAD + chat(" a") + chat(" b"), TokenTrail(b"11", b"1"))],  # one short
        # a reasoning parser's delta
        [
            WrittenEntry(
                HEAD + chat(" a").replace(b'"content"', b'"reasoning"'), TokenTrail(b"11", b"1")
            )
        ],
        [WrittenEntry(HEAD + chat(" a"), TokenTrail(b"11", b"1", redone=2))],
    ],
)
def test_ids_that_cannot_make_the_answer_go_on_exactly_give_no_seam(
    entries: list[WrittenEntry],
) -> None:
    assert seam_of(RequestKind.CHAT, entries) is None


# --- the request for the rest ------------------------------------------------------------

SEAM = Seam([1, 2, 3], [11, 12], 0, IDENT)


def test_a_chat_answer_goes_on_as_a_completion_of_the_prompts_and_answers_ids() -> None:
    payload = orjson.dumps({
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_completion_tokens": 10, "max_tokens": 99, "min_tokens": 5, "temperature": 0.7,
        "stream_options": {"include_usage": True}, "request_id": "j", "ignore_eos": True,
        "add_generation_prompt": True, "chat_template_kwargs": {"x": 1},
    })  # fmt: skip
    body = orjson.loads(token_continuation(RequestKind.CHAT, payload, SEAM, 512) or b"")
    assert body == {
        "model": "tiny", "stream": True, "max_tokens": 8, "min_tokens": 3, "temperature": 0.7,
        "stream_options": {"include_usage": True}, "request_id": "j", "ignore_eos": True,
        "prompt": [1, 2, 3, 11, 12], "return_token_ids": True,
    }  # fmt: skip


def test_the_length_left_is_the_engines_limit_less_the_tokens_kept() -> None:
    def left(kind: RequestKind, body: dict[str, Any], context: int | None) -> int | None:
        out = token_continuation(kind, orjson.dumps(body), SEAM, context)
        return None if out is None else int(orjson.loads(out)["max_tokens"])

    chat_body = {"messages": []}
    assert left(RequestKind.CHAT, chat_body, 100) == 100 - 3 - 2  # to the context's end
    assert left(RequestKind.CHAT, {**chat_body, "max_tokens": 500}, 100) == 95  # clamped
    assert left(RequestKind.COMPLETION, {"prompt": "x"}, None) == 16 - 2  # vLLM's default
    assert left(RequestKind.COMPLETION, {"prompt": "x", "max_tokens": 2}, None) is None
    with pytest.raises(LookupError):  # a chat without limit needs the context length
        left(RequestKind.CHAT, chat_body, None)
    assert needs_context_len(RequestKind.CHAT, orjson.dumps(chat_body))
    assert not needs_context_len(RequestKind.CHAT, orjson.dumps({**chat_body, "max_tokens": 5}))
    assert not needs_context_len(RequestKind.COMPLETION, b'{"prompt":"x"}')


# --- the continuation's chunks, as the client's stream needs them ------------------------


def test_completion_chunks_become_the_chat_clients_chunks_with_its_id() -> None:
    reshape = Reshaper(RequestKind.CHAT, Seam([1], [11], 2, IDENT))
    events, trail = reshape(completion(" x", [5]) + completion(" y", [6], "length"))
    assert events == chat(" x") + chat(" y", "length").replace(
        b'"finish_reason":"length"', b'"finish_reason":"length","stop_reason":null'
    )
    assert trail == TokenTrail(b"5;6", redone=2)
    assert reshape(completion(" z", [7]))[1] == TokenTrail(b"7")  # redone: the first only
    tail, _ = reshape(usage(5, 3))
    assert orjson.loads(tail[6:]) == {
        "id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 17, "model": "tiny",
        "choices": [], "usage": {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3},
        "system_fingerprint": "vllm-0.32.0-6c",
    }  # fmt: skip


def test_a_completions_chunks_keep_their_shape_with_the_first_attempts_id() -> None:
    ident = Ident("cmpl-b", 17, "tiny")
    events, trail = Reshaper(RequestKind.COMPLETION, Seam([1], [], 0, ident))(completion(" x", [5]))
    assert events == FIRST.replace(b'"text":" as"', b'"text":" x"')
    assert trail == TokenTrail(b"5")


# --- the attempt after a cut --------------------------------------------------------------


def test_a_resumed_attempt_goes_on_from_token_ids_when_it_can_else_from_text() -> None:
    claimed = job({"model": "tiny", "messages": [], "max_tokens": 10, "stream": True})
    written = [WrittenEntry(HEAD + chat(" a") + chat(" b"), TokenTrail(b"11;12", b"1,2,3"))]
    exact = attempt.resumed(claimed, written, seam_of(claimed.kind, written), None)
    assert isinstance(exact, attempt.Attempt) and exact.exact
    assert exact.url == "http://e:8000/v1/completions"
    assert exact.earlier == Earlier(" a b", 2)  # usage: 2 tokens counted once
    text = attempt.resumed(claimed, written, None, None)
    assert isinstance(text, attempt.Attempt) and not text.exact
    assert text.url == "http://e:8000/v1/chat/completions"
    ended = [WrittenEntry(HEAD + chat(" a", "stop"), TokenTrail(b"11", b"1"))]
    assert isinstance(attempt.resumed(claimed, ended, None, None), attempt.Whole)


def test_an_answer_taken_back_after_its_last_token_owes_its_client_the_usage_chunk() -> None:
    # Taken back between the chunk with its finish reason and its usage chunk: the client
    # that asked for usage gets it from the next attempt (8 prompt ids recorded, 2 tokens).
    claimed = job({"model": "tiny", "messages": [], "max_tokens": 2, "stream": True})
    trail = TokenTrail(b"11;12", b"4,204,2847,336,2,204,5,204")
    ended = [WrittenEntry(HEAD + chat(" a") + chat(" b", "length"), trail)]
    whole = attempt.resumed(claimed, ended, seam_of(claimed.kind, ended), None)
    assert isinstance(whole, attempt.Whole) and whole.usage is not None
    assert orjson.loads(whole.usage.removeprefix(b"data: ")) == {
        "id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 17, "model": "tiny",
        "choices": [], "usage": {"prompt_tokens": 8, "total_tokens": 10, "completion_tokens": 2},
    }  # fmt: skip
    assert whole.usage.endswith(b"\n\n")
    # Not when it came already, nor without the prompt's ids, nor to a client not asking
    assert owed_usage([*ended, WrittenEntry(usage(8, 2))], 2) is None
    assert owed_usage([WrittenEntry(HEAD + chat(" a", "length"))], 1) is None
    plain = replace(claimed, stream_flag=StreamMode.STREAMED)
    assert attempt.resumed(plain, ended, None, None) == attempt.Whole(Earlier(" a b", 2, "length"))


def test_a_job_taken_back_before_its_first_output_starts_afresh_with_its_role_chunk() -> None:
    claimed = job({"model": "tiny", "messages": [], "max_tokens": 10, "stream": True})
    again = attempt.resumed(claimed, [], None, None)
    assert again == attempt.fresh(claimed)  # no continuation of an empty answer
    assert isinstance(again, attempt.Attempt) and again.earlier is None
    assert again.shape is not None
    events, trail = again.shape(HEAD_IDS)  # its client gets the opening role chunk
    assert b'"role":"assistant"' in events and trail is not None and trail.prompt_tokens


# --- every cut, end to end on the simulator's engine model -------------------------------


def sim_stream(body: dict[str, Any], *, chat: bool) -> bytes:
    """What the simulator sends for ``body`` (its usage chunk included, no [DONE])."""
    from sim import SimProfile
    from sim._app import response_meta
    from sim._parsing import parse_request
    from sim._wire import StreamFrames

    req = parse_request(orjson.dumps(body), chat=chat, models=["tiny"], profile=SimProfile())
    frames = StreamFrames(response_meta(req, 1700, "fp"), chat=chat)
    tail = frames.tail(req.max_tokens, include_usage=True)
    return frames.tokens(0, req.max_tokens, last=True) + tail.removesuffix(b"data: [DONE]\n\n")


@pytest.mark.parametrize("kind", [RequestKind.CHAT, RequestKind.COMPLETION])
def test_at_every_cut_the_client_gets_the_uncut_stream_byte_for_byte(kind: RequestKind) -> None:
    from workers.engine import Accounting

    chat_kind = kind is RequestKind.CHAT
    prompt: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "tell me"}]} if chat_kind else {"prompt": "Once"}
    )
    body = {"model": "tiny", **prompt, "max_tokens": 12, "stream": True, "request_id": "j",
            "stream_options": {"include_usage": True}}  # fmt: skip
    uncut = sim_stream(body, chat=chat_kind)
    asked = orjson.loads(asking_token_ids(orjson.dumps(body)))
    with_ids = sim_stream(asked, chat=chat_kind)
    events = [e + b"\n\n" for e in with_ids.split(b"\n\n")[:-1]]
    head = 1 if chat_kind else 0  # the role chunk
    for cut in range(1, 12):
        sent, trail = take_token_ids(b"".join(events[: head + cut]))
        seam = seam_of(kind, [WrittenEntry(sent, trail)])
        assert seam is not None and len(seam.kept) == cut
        rest = orjson.loads(token_continuation(kind, orjson.dumps(body), seam, 512) or b"")
        engine = sim_stream(rest, chat=False)
        accounting = Accounting(earlier=Earlier("", cut))  # usage counted once
        shaped, _ = Reshaper(kind, seam)(accounting.scan(engine, keep_usage=True))
        assert sent + shaped == uncut, f"cut after {cut} tokens"
        assert accounting.usage == {"prompt_tokens": len(seam.prompt), "total_tokens":
                                    len(seam.prompt) + 12, "completion_tokens": 12}  # fmt: skip


async def test_the_context_length_comes_from_the_engines_model_list_once() -> None:
    from sim import SimProfile, create_app
    from tests.support.servers import uvicorn_thread
    from workers.engine_info import ContextLengths

    lengths = ContextLengths()
    with uvicorn_thread(create_app(["tiny"], SimProfile(max_model_len=512))) as url:
        assert await lengths.get(url, "tiny") == 512
        assert await lengths.get(url, "other") is None  # not served there
    assert await lengths.get(url, "tiny") == 512  # known: not asked again
