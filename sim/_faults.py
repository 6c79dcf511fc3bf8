"""Injected faults: how the simulated engine misbehaves, per request or for every request.

A request asks for a fault with the extra body field ``sim_fault`` (fairq passes
unknown fields through to the engine, so a test can set it on the request it
sends to the gateway); a profile's ``fault`` applies to every request that sets
none. Real vLLM ignores the field. Kinds:

    status       answer ``status`` (default 503) with vLLM's error body and ``message``
    hang         send nothing more for ``hang_s`` (default: an hour) after ``after_tokens``
                 tokens (0: right after the response headers), then go on
    cut          end the stream after ``after_tokens`` tokens, without ``[DONE]``
    malformed    send a broken event after ``after_tokens`` tokens, then go on
    error_event  send vLLM's mid-stream error event after ``after_tokens`` tokens, then
                 ``[DONE]`` (as vLLM does when generation fails)

``times`` limits the fault to the first calls with the same ``request_id`` (fairq
sends the job id), so a retry of the same job can succeed; unset, every call
gets it. A refused connection needs no simulator: point an endpoint at a port
where nothing listens.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim._errors import RequestError

FIELD = "sim_fault"
_HOUR_S = 3600.0


class Fault(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["status", "hang", "cut", "malformed", "error_event"]
    status: int = Field(default=503, ge=400, le=599)
    message: str = "The simulated engine failed on purpose."
    after_tokens: int = Field(default=0, ge=0)
    hang_s: float = Field(default=_HOUR_S, ge=0)
    times: int | None = Field(default=None, ge=1)


def parse_fault(body: dict[str, Any], default: Fault | None) -> Fault | None:
    raw = body.get(FIELD)
    if raw is None:
        return default
    try:
        return Fault.model_validate(raw)
    except ValidationError as exc:
        raise RequestError(400, "BadRequestError", f"invalid '{FIELD}': {exc}") from exc


class FaultBook:
    """Counts the calls per request id, so a fault with ``times`` stops after that many."""

    _LIMIT = 100_000  # forget old ids rather than grow without bound

    def __init__(self) -> None:
        self._calls: Counter[str] = Counter()

    def active(self, fault: Fault | None, request_id: str) -> Fault | None:
        if fault is None or fault.times is None:
            return fault
        if len(self._calls) > self._LIMIT:
            self._calls.clear()
        self._calls[request_id] += 1
        return fault if self._calls[request_id] <= fault.times else None


def malformed_event() -> bytes:
    return b'data: {"id": "cmpl-broken", "choices": [{"text": "\n\n'


def error_event(fault: Fault) -> bytes:
    error = {
        "object": "error",
        "message": fault.message,
        "type": "InternalServerError",
        "param": None,
        "code": 500,
    }
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"
