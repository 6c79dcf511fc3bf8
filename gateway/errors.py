"""Every error leaves the gateway as an OpenAI error object, never as HTML or a trace.

``{"error": {"message", "type", "param", "code"}}`` with the status of the
``FairqError`` (see ``broker.errors``; ``param`` names the request field at fault,
else null); routing errors (404, 405) and FastAPI's validation errors get the
same shape. An admin route is an unknown URL (404) to anyone without an admin key
(``auth.Admin``), a wrong method on it included. A Redis error (Redis down, or not
answering within ``redis_command_timeout_s``), raw or as the broker's
``BrokerUnavailable``, is a 503 ``redis_unavailable``: the request may be sent again.
Its text names Redis's address (a Lua error, the script's keys), so the client is given
an error id instead, in the message and as ``X-Fairq-Error-Id``, which the log records
with the text at WARNING. An unexpected exception is logged once at ERROR (type and
route; never headers or bodies, which hold API keys and prompts) under an error id, and
answered with a 500 that names that id the same two ways by ``CatchAll``, the outermost
middleware. (A failed job's correlation id is its job id: ``broker.failure_text``.)
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.errors import (
    BrokerUnavailable,
    FairqError,
    InvalidRequest,
    NotFound,
    OverQuota,
    QueueFull,
    Unauthorized,
)
from gateway.ratelimit import ratelimit_headers, refusal_headers

log = logging.getLogger(__name__)

JOB_HEADER = "X-Fairq-Job-Id"
# On the answer to a request whose Idempotency-Key made its job, file or batch before (as
# Stripe says it): the same job's answer, replayed.
REPLAYED_HEADER = "Idempotent-Replayed"
# On a 503 of a Redis failure and on a 500: the id the gateway's log holds the detail under.
ERROR_ID_HEADER = "X-Fairq-Error-Id"

# Where the admin routes are. To anyone else they do not exist: a 405 for a wrong method
# on one would say that it does.
ADMIN_PATHS = ("/admin/", "/v1/admin/")


def json_response(
    content: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(content), status, headers, media_type="application/json")


def list_response(data: list[dict[str, object]], has_more: bool) -> Response:
    """One page of an OpenAI list (files, batches): the ids around it for ``after``."""
    return json_response(
        {
            "object": "list",
            "data": data,
            "has_more": has_more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )


def error_response(exc: FairqError, headers: dict[str, str] | None = None) -> Response:
    headers = dict(headers or {})
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(exc.retry_after_s)
        if exc.quota is not None:
            headers.update(ratelimit_headers(exc.quota))
    if isinstance(exc, OverQuota):
        headers.update(refusal_headers(exc))
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    if exc.final:  # OpenAI's clients retry a 408, a 409 and a 5xx unless told not to
        headers["x-should-retry"] = "false"
    return json_response(exc.to_body(), exc.status, headers)


def unknown_url(request: Request) -> NotFound:
    """The 404 of a URL that does not exist, and of an admin route to anyone else."""
    return NotFound(f"Invalid URL ({request.method} {request.url.path})", code="unknown_url")


def _openai_body(message: str, type_: str, code: str | None) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


async def _on_fairq_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FairqError)
    if isinstance(exc, BrokerUnavailable):  # the broker's message holds redis-py's text
        return await _on_redis_error(request, exc)
    return error_response(exc)


async def _on_redis_error(request: Request, exc: Exception) -> Response:
    error_id = secrets.token_hex(6)
    where = f"{request.method} {request.url.path}"
    gateway = getattr(request.app.state, "gateway", None)  # None: before the lifespan opened it
    redis = gateway.settings.redis_address() if gateway is not None else "unknown"
    log.warning(
        "%s: Redis at %s failed (error id %s): %s: %s",
        *(where, redis, error_id, type(exc).__name__, exc),
    )
    return error_response(
        BrokerUnavailable(
            "the queue's store (Redis) is unavailable: retry in a few seconds (error id "
            f"{error_id}: the operator's log has the detail under it)"
        ),
        {ERROR_ID_HEADER: error_id},
    )


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    admin = request.url.path.startswith(ADMIN_PATHS)
    if exc.status_code == 404 or (exc.status_code == 405 and admin):
        return error_response(unknown_url(request))
    if exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}"
        body = _openai_body(message, "invalid_request_error", "method_not_allowed")
    else:
        body = _openai_body(str(exc.detail), "invalid_request_error", None)
    return json_response(body, exc.status_code, exc.headers)


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {}
    loc = first.get("loc", ())
    where = ".".join(str(p) for p in loc) or "request"
    # ('query', 'limit'): the parameter is the name after where it came from.
    param = str(loc[1]) if len(loc) > 1 else None
    return error_response(
        InvalidRequest(f"invalid {where}: {first.get('msg', 'invalid')}", param=param)
    )


def install_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FairqError, _on_fairq_error)
    app.add_exception_handler(RedisError, _on_redis_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_middleware(CatchAll)


class CatchAll:
    """Turns an unexpected exception into a 500 error object (pure ASGI: streams untouched).

    Starlette's own last-resort handler re-raises after answering, so uvicorn would
    log every failure a second time with its own traceback.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # the client is gone; nobody to answer
        except Exception:
            error_id = secrets.token_hex(6)
            where = f"{scope['method']} {scope['path']}"
            log.exception("unhandled error on %s (error id %s)", where, error_id)
            if started:
                raise  # mid-response: only closing the connection tells the client
            message = f"internal server error (error id {error_id}: the operator's log has it)"
            body = _openai_body(message, "server_error", "internal_error")
            await json_response(body, 500, {ERROR_ID_HEADER: error_id})(scope, receive, send)
