"""The worker's scan of streamed events (workers.engine.Accounting), on hand-made pieces.

Pure: no I/O. Each case is checked as one piece and, where it holds several events,
cut into single events as the engine usually sends them, so the one-token fast path
and the general path must agree.
"""

from __future__ import annotations

import pytest

from workers.engine import Accounting, _EventCutter
from workers.errors import EngineError

TOKEN = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":" hi"},"finish_reason":null}]}\n\n'
)
LAST = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{},"finish_reason":"length"}]}\n\n'
)
USAGE = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
)
DONE = b"data: [DONE]\n\n"
ERROR = b'data: {"error":{"message":"overloaded","code":503}}\n\n'
VLLM_ERROR = b'data: {"object":"error","message":"out of blocks","code":500}\n\n'


def _scan_pieces(pieces: list[bytes], keep_usage: bool) -> tuple[Accounting, bytes]:
    accounting, out = Accounting(), []
    cutter = _EventCutter(accounting, keep_usage, out.append)
    for piece in pieces:
        try:
            cutter.feed(piece)
        except EngineError:
            break
    return accounting, b"".join(out)


@pytest.fixture(params=["whole", "one event per piece", "split mid-event"])
def cut(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """How the engine's bytes arrive: all at once, an event at a time, or cut anywhere."""

    def pieces(stream: bytes) -> list[bytes]:
        if request.param == "whole":
            return [stream]
        if request.param == "one event per piece":
            return [e + b"\n\n" for e in stream.split(b"\n\n")[:-1]]
        return [stream[i : i + 37] for i in range(0, len(stream), 37)]

    return pieces


def test_tokens_pass_through_unchanged_and_the_finish_reason_is_noted(cut) -> None:  # type: ignore[no-untyped-def]
    accounting, out = _scan_pieces(cut(TOKEN + TOKEN + LAST + DONE), keep_usage=False)
    assert out == TOKEN + TOKEN + LAST  # [DONE] is the gateway's to send
    assert accounting.finish_reason == "length"
    assert accounting.done and accounting.failure is None and accounting.usage is None


@pytest.mark.parametrize("keep", [False, True])
def test_the_usage_chunk_is_noted_and_forwarded_only_when_asked(cut, keep: bool) -> None:  # type: ignore[no-untyped-def]
    accounting, out = _scan_pieces(cut(TOKEN + LAST + USAGE + DONE), keep_usage=keep)
    assert accounting.usage == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert out == TOKEN + LAST + (USAGE if keep else b"")
    assert accounting.done


@pytest.mark.parametrize("error", [ERROR, VLLM_ERROR])
def test_an_error_event_ends_the_stream_after_the_tokens_before_it(cut, error: bytes) -> None:  # type: ignore[no-untyped-def]
    accounting, out = _scan_pieces(cut(TOKEN + TOKEN + error + TOKEN + DONE), keep_usage=False)
    assert out == TOKEN + TOKEN
    assert accounting.failure is not None and accounting.failure.code == "engine_stream_error"
    assert not accounting.done


@pytest.mark.parametrize(
    "bad", [b"data: not json\n\n", b"data:{}\n\ndata: [1,2]\n\n", b"event: x\n\n"]
)
def test_a_malformed_event_fails_the_stream_after_the_good_ones(cut, bad: bytes) -> None:  # type: ignore[no-untyped-def]
    accounting, out = _scan_pieces(cut(TOKEN + bad + TOKEN), keep_usage=False)
    assert out.startswith(TOKEN) and b"not json" not in out and b"[1,2]" not in out
    assert accounting.failure is not None and accounting.failure.code == "engine_bad_chunk"


def test_comments_are_dropped_and_crlf_is_normalised(cut) -> None:  # type: ignore[no-untyped-def]
    stream = b": keep-alive\r\n\r\n" + TOKEN.replace(b"\n\n", b"\r\n\r\n") + DONE
    accounting, out = _scan_pieces(cut(stream), keep_usage=False)
    assert out == TOKEN and accounting.done and accounting.failure is None


def test_a_token_whose_text_mentions_the_markers_is_only_a_token() -> None:
    """The fast path looks for markers as bytes; JSON escapes a quote inside a string, so
    text that names them cannot look like the real member."""
    text = b'data: {"choices":[{"delta":{"content":"\\"finish_reason\\":\\"x\\" usage"}}]}\n\n'
    accounting, out = _scan_pieces([text], keep_usage=False)
    assert out == text
    assert accounting.finish_reason is None and accounting.usage is None


def test_a_finish_reason_that_is_not_a_word_is_passed_on_not_noted() -> None:
    odd = b'data: {"choices":[{"delta":{},"finish_reason":"42"}]}\n\n'
    accounting, out = _scan_pieces([odd + LAST], keep_usage=False)
    assert out == odd + LAST and accounting.finish_reason == "length"
    accounting, out = _scan_pieces([odd], keep_usage=False)
    assert out == odd and accounting.finish_reason is None and accounting.failure is None
