"""The gateway's OpenAPI schema, served at ``/openapi.json``.

The completion, batch and file routes read their bodies by hand (size-capped,
validated, the other completion fields a model allows passed on to the engine:
``broker.engine_fields``), so FastAPI cannot see them; this module adds what it
cannot: the request bodies (for the
completions generated from the very pydantic models that validate them, with
``model`` limited to the configured models; for batches and files from the
limits their routes enforce; ``service_tier`` limited to the configured tiers); the
``X-Fairq-Band``, ``X-Fairq-Max-Queue-S``, ``X-Fairq-Stream-Headers`` and
``Idempotency-Key`` headers; bearer authentication; and the OpenAI error object of every
error status. A fuzzer
(tests/integration/test_schema.py) generates its requests from this document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from broker.batch import KINDS
from broker.deadlines import MAX_QUEUE_S, SECONDS_PATTERN
from broker.idempotency import HEADER as IDEMPOTENCY_HEADER
from broker.idempotency import MAX_KEY_CHARS
from broker.requests import ChatBody, CompletionBody, EmbeddingBody, ResponseBody
from broker.settings import Settings
from broker.tiers import ServiceTiers
from gateway.batches import METADATA_LIMITS
from gateway.completions import (
    BAND_HEADER,
    MAX_QUEUE_HEADER,
    STREAM_HEADERS_HEADER,
    STREAM_HEADERS_HOLD,
)
from gateway.connections import MAX_HEADER_BYTES

_REF = "#/components/schemas/{model}"
_BODIES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatBody,
    "/v1/completions": CompletionBody,
    "/v1/embeddings": EmbeddingBody,
    "/v1/responses": ResponseBody,
}
_ERRORS = {
    "400": "invalid request (body, header or parameter)",
    "401": "missing or invalid API key",
    "403": "a band or model the key is not entitled to",
    "404": "unknown model, job or URL (another user's job is not found either)",
    "408": "the job expired in the queue (its band's deadline, or its X-Fairq-Max-Queue-S), "
    "or the request did not arrive in time",
    "409": "the job was cancelled, or the Idempotency-Key was used with another request",
    "410": "what the Idempotency-Key made is gone: its job's result expired (result_ttl_s)",
    "413": "request body over max_body_bytes",
    "429": "the user has max_queued_per_user jobs queued (queue_full), or a quota of the "
    "key's tenant or user would be passed (rate_limit_exceeded); see Retry-After",
    "431": f"the request line and headers are over {MAX_HEADER_BYTES // 1024} KiB",
    "503": "Redis is unavailable, the gateway is shutting down or holds its most connections",
}
# The routes that create work, each taking an Idempotency-Key (broker.idempotency).
_IDEMPOTENT = (*_BODIES, "/v1/files", "/v1/batches")
_IDEMPOTENCY_PARAMETER = {
    "name": IDEMPOTENCY_HEADER,
    "in": "header",
    "required": False,
    "description": "a key of your own (a UUID) that makes the request idempotent: sent "
    "again with the same key and request within idempotency_window_s, it gets the job, "
    "file or batch the first try made (Idempotent-Replayed: true); the same key with "
    "another request is a 409 idempotency_key_reused",
    "schema": {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_KEY_CHARS,
        "pattern": "^[ -~]+$",
    },
}
_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},  # the request field at fault
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Make ``app.openapi()`` (served at ``app.openapi_url``) return the full schema."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_schema(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_schema(app: FastAPI, settings: Settings) -> dict[str, Any]:
    schema = get_openapi(
        title=app.title, version=app.version, routes=app.routes, description=app.description
    )
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas["Error"] = _ERROR_SCHEMA
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    models = [m.name for m in settings.models]
    tiers = list(ServiceTiers.of(settings).names)
    for path, body in _BODIES.items():
        schemas[body.__name__] = _body_schema(body, models, tiers, schemas)
        _document_completion(schema["paths"][path]["post"], body.__name__, settings)
    schemas["BatchBody"] = _batch_schema(settings)
    _json_body(schema["paths"]["/v1/batches"]["post"], "BatchBody")
    schema["paths"]["/v1/files"]["post"]["requestBody"] = _UPLOAD
    for path in _IDEMPOTENT:
        schema["paths"][path]["post"].setdefault("parameters", []).append(_IDEMPOTENCY_PARAMETER)
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            if path.startswith("/v1/"):
                operation["security"] = [{"bearer": []}]
                _document_errors(operation)
    return schema


def _body_schema(
    body: type[BaseModel], models: list[str], tiers: list[str], schemas: dict[str, Any]
) -> dict[str, Any]:
    generated = body.model_json_schema(ref_template=_REF)
    schemas.update(generated.pop("$defs", {}))
    if models:
        generated["properties"]["model"]["enum"] = models
    named = [{"type": "string", "enum": tiers}] if tiers else []
    generated["properties"]["service_tier"] = {
        "anyOf": [*named, {"type": "null"}],
        "default": None,
        "description": "the priority band to queue in, by OpenAI's tier (service_tiers); "
        "the response says the tier it was served in",
    }
    return generated


def _batch_schema(settings: Settings) -> dict[str, Any]:
    pairs, key, value = METADATA_LIMITS
    return {
        "type": "object",
        "required": ["input_file_id", "endpoint", "completion_window"],
        "properties": {
            "input_file_id": {"type": "string", "minLength": 1},
            "endpoint": {"type": "string", "enum": list(KINDS)},
            "completion_window": {
                "type": "string",
                "enum": list(settings.batch.completion_windows),
            },
            "metadata": {
                "type": ["object", "null"],
                "maxProperties": pairs,
                "propertyNames": {"maxLength": key},
                "additionalProperties": {"type": "string", "maxLength": value},
            },
        },
    }


_UPLOAD = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["purpose", "file"],
                "properties": {
                    "purpose": {"type": "string", "enum": ["batch"]},
                    "file": {"type": "string", "format": "binary"},
                },
            }
        }
    },
}


def _json_body(operation: dict[str, Any], name: str) -> None:
    ref = {"$ref": _REF.format(model=name)}
    operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}


def _document_completion(operation: dict[str, Any], body: str, settings: Settings) -> None:
    _json_body(operation, body)
    operation.setdefault("parameters", []).append(
        {
            "name": BAND_HEADER,
            "in": "header",
            "required": False,
            "description": "queue in this priority band instead of the key's default "
            "(only a band the key is entitled to)",
            "schema": {"type": "string", "enum": list(settings.bands)},
        }
    )
    operation["parameters"].append(
        {
            "name": MAX_QUEUE_HEADER,
            "in": "header",
            "required": False,
            "description": "seconds the job may wait in the queue before it ends expired "
            f"(408 job_expired), above 0 and at most {MAX_QUEUE_S}; a value beyond the "
            "band's own deadline (queue_deadline_s) is clamped to it",
            "schema": {"type": "string", "pattern": f"^(?:{SECONDS_PATTERN})$"},
        }
    )
    operation["parameters"].append(
        {
            "name": STREAM_HEADERS_HEADER,
            "in": "header",
            "required": False,
            "description": "with stream: true, when the response headers go out: with the "
            "first token or the job's end (first-event: a failure before any output gets "
            "the status and error of the request not streamed), or at once (early: the job "
            "id while it is queued; a later failure is an error event)",
            "schema": {"type": "string", "enum": list(STREAM_HEADERS_HOLD)},
        }
    )
    operation["responses"]["200"] = {
        "description": "the engine's response; with stream: true, Server-Sent Events",
        "content": {"application/json": {}, "text/event-stream": {}},
    }


def _document_errors(operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)  # FastAPI's own validation error: the gateway answers 400
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for status, description in _ERRORS.items():
        responses.setdefault(status, {"description": description, "content": error})
