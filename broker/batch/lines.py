"""One line of a batch: checking an input line, and the records a line ends as (pure).

An input line is OpenAI's ``{"custom_id", "method": "POST", "url", "body"}``.
Every line ends as exactly one record, in the output file when its request
completed, else in the error file::

    {"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}
    {"id", "custom_id", "response": null, "error": {"code", "message", "line"}}

The second shape is for a line that never ran (invalid, cancelled, expired); a
request the engine failed keeps the first shape with its error status and body.
Records are stored with a one-byte prefix, ``o`` (output) or ``e`` (error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from broker.engine_fields import check_fields
from broker.errors import InvalidRequest
from broker.failure_text import client_message
from broker.jobs import RequestKind
from broker.requests import check_body
from broker.settings import ModelConfig, Settings

KINDS = {"/v1/chat/completions": RequestKind.CHAT, "/v1/completions": RequestKind.COMPLETION}
OUTPUT, ERROR = b"o", b"e"


@dataclass(frozen=True)
class ValidLine:
    number: int
    custom_id: str
    model: ModelConfig
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    number: int
    custom_id: str | None
    code: str
    message: str


def _envelope(line: object, number: int, endpoint: str) -> tuple[str, dict[str, Any]]:
    """The custom_id and body of a line; raises LineError-worthy ValueError(code, message)."""
    if not isinstance(line, dict):
        raise ValueError("invalid_line", "the line is not a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise ValueError("missing_custom_id", "the line has no custom_id (a non-empty string)")
    if line.get("method", "POST") != "POST":
        raise ValueError("invalid_method", f"method must be POST, not {line.get('method')!r}")
    if line.get("url") != endpoint:
        raise ValueError(
            "invalid_url", f"url {line.get('url')!r} is not the batch's endpoint {endpoint!r}"
        )
    body = line.get("body")
    if not isinstance(body, dict):
        raise ValueError("invalid_body", "body must be a JSON object")
    return custom_id, body


def _custom_id(line: object) -> str | None:
    value = line.get("custom_id") if isinstance(line, dict) else None
    return value if isinstance(value, str) and value else None


def check_line(
    number: int, raw: bytes, endpoint: str, settings: Settings, models: tuple[str, ...] | None
) -> ValidLine | LineError:
    """Check one input line against the batch's endpoint, the owner's entitlement and the
    fields its model lets reach the engine (``broker.engine_fields``)."""
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return LineError(number, None, "invalid_json", f"line {number} is not valid JSON: {exc}")
    try:
        custom_id, body = _envelope(line, number, endpoint)
        check_body(KINDS[endpoint], body)
    except ValueError as exc:
        code, message = exc.args
        return LineError(number, _custom_id(line), code, f"line {number}: {message}")
    except InvalidRequest as exc:
        return LineError(number, _custom_id(line), "invalid_request", f"line {number}: {exc}")
    if body.get("stream"):
        return LineError(
            number,
            custom_id,
            "invalid_request",
            f"line {number}: a batch request cannot be streamed (stream: true)",
        )
    model = _model(number, custom_id, body, kind=KINDS[endpoint], settings=settings, models=models)
    return model if isinstance(model, LineError) else ValidLine(number, custom_id, model, body)


def _model(
    number: int,
    custom_id: str,
    body: dict[str, Any],
    *,
    kind: RequestKind,
    settings: Settings,
    models: tuple[str, ...] | None,
) -> ModelConfig | LineError:
    """The line's model, if the batch's owner may use it and it lets the line's fields
    reach its engine."""
    model = settings.model(body["model"])
    if model is None or (models is not None and model.name not in models):
        return LineError(
            number,
            custom_id,
            "model_not_found",
            f"line {number}: the model `{body['model']}` does not exist "
            "or you do not have access to it",
        )
    try:
        check_fields(kind, body, model)
    except InvalidRequest as exc:
        return LineError(number, custom_id, exc.code or "invalid_request", f"line {number}: {exc}")
    return model


def line_id(batch_id: str, number: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{number}"


def error_record(batch_id: str, error: LineError) -> bytes:
    """The error-file record of a line that never ran."""
    record = {
        "id": line_id(batch_id, error.number),
        "custom_id": error.custom_id,
        "response": None,
        "error": {"code": error.code, "message": error.message, "line": error.number},
    }
    return ERROR + orjson.dumps(record)


def response_record(
    batch_id: str, number: int, custom_id: str, job_id: str, *, status: int, body: bytes
) -> bytes:
    """The record of a line whose request ran: output file if 200, else error file."""
    record = {
        "id": line_id(batch_id, number),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": job_id, "body": orjson.Fragment(body)},
        "error": None,
    }
    return (OUTPUT if status == 200 else ERROR) + orjson.dumps(record)


def failed_body(error: dict[str, object] | None, job_id: str) -> tuple[int, bytes]:
    """Status and OpenAI error body of job ``job_id``, failed at the engine or the worker:
    the status the engine answered where it answered one (the worker's
    ``engine_status``), else the one the API would have answered; a 5xx's message as the
    API would say it (``broker.failure_text``: without the server's detail)."""
    error = dict(error or {"message": "the request failed", "type": "server_error"})
    engine_status, status = error.pop("engine_status", None), error.pop("status", 500)
    if isinstance(engine_status, int) and 400 <= engine_status < 600:
        status = engine_status
    if not isinstance(status, int) or not 400 <= status < 600:
        status = 500
    error["message"] = client_message(error, status, job_id)
    error.setdefault("code", None)
    return status, orjson.dumps({"error": error})
