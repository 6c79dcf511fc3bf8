"""The worker's side of the Responses API and embeddings (pure): a Responses stream's
accounting (named events, no ``[DONE]``, usage in ``response.completed``), usage in
fairq's names, the tier written into the response an event carries, and the gateway's
end of a Responses stream."""

from __future__ import annotations

import orjson

from broker import JobState, RequestKind
from broker.results import ResultEvent
from gateway.sse import _end_frame
from workers.engine import Accounting, ResponsesAccounting, accounting_for, fairq_usage
from workers.errors import EngineError
from workers.service_tier import TierStamp

USAGE = {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10,
         "input_tokens_details": {"cached_tokens": 0}}  # fmt: skip


def event(kind: str, **data: object) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps({"type": kind, **data}))


def created(tier: str = "auto") -> bytes:
    return event("response.created", response={"id": "resp_1", "service_tier": tier})


def completed(status: str = "completed") -> bytes:
    response = {"id": "resp_1", "status": status, "usage": USAGE, "service_tier": "auto"}
    return event("response.completed", response=response)


def test_a_responses_stream_passes_as_it_came_and_ends_at_response_completed() -> None:
    accounting = ResponsesAccounting()
    opened = created() + event("response.output_text.delta", delta=" hi")
    assert accounting.scan(opened, keep_usage=False) == opened and not accounting.done
    assert accounting.scan(b": keep-alive\n\n" + completed(), False) == completed()
    assert accounting.done and accounting.finish_reason == "completed"
    assert accounting.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_an_error_event_ends_the_stream_after_the_events_before_it() -> None:
    accounting = ResponsesAccounting()
    failing = event("error", code="x", message="overloaded")
    delta = event("response.output_text.delta", delta=" hi")
    assert accounting.scan(delta + failing + delta, False) == delta
    assert isinstance(accounting.failure, EngineError)
    assert accounting.failure.code == "engine_stream_error"


def test_a_malformed_event_is_the_engines_failure() -> None:
    accounting = ResponsesAccounting()
    assert accounting.scan(b"event: response.created\ndata: [1]\n\n", False) == b""
    assert accounting.failure is not None and accounting.failure.code == "engine_bad_chunk"


def test_a_whole_response_and_an_embedding_record_usage_in_fairqs_names() -> None:
    accounting = Accounting()
    body = {"object": "response", "status": "incomplete", "usage": USAGE,
            "incomplete_details": {"reason": "max_output_tokens"}}  # fmt: skip
    accounting.scan_body(orjson.dumps(body))
    assert accounting.usage is not None and accounting.usage["completion_tokens"] == 3
    assert accounting.finish_reason == "max_output_tokens"
    embedding = {"prompt_tokens": 4, "total_tokens": 4}
    assert fairq_usage(embedding) == embedding
    assert isinstance(accounting_for(RequestKind.RESPONSE), ResponsesAccounting)
    assert type(accounting_for(RequestKind.EMBEDDING)) is Accounting


def test_the_tier_goes_into_the_response_an_event_carries_and_nowhere_else() -> None:
    stamp = TierStamp("flex")
    delta = event("response.output_text.delta", delta=" hi")
    stamped = stamp.response_events(created() + delta)
    assert stamped == created("flex") + delta


def test_a_responses_stream_ends_without_done_and_fails_with_an_error_event() -> None:
    ok = ResultEvent(b"5-0", end=JobState.COMPLETED)
    assert _end_frame(ok, "job", named=True) == b""
    failed = ResultEvent(b"5-0", end=JobState.FAILED, error={"message": "m", "code": "c"})
    frame = _end_frame(failed, "job", named=True)
    assert frame.startswith(b"id: 5-0.0\nevent: error\ndata: ") and b"[DONE]" not in frame
    data = orjson.loads(frame.split(b"data: ", 1)[1])
    assert data["type"] == "error" and data["code"] == "c" and data["error"]["code"] == "c"
