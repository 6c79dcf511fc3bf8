"""``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and
``/v1/responses``: queue, then answer. Each is a ``RequestKind`` with its own schema and
fields; all go through the same checks, queue and answers below (an embedding is never
streamed; a Responses stream is relayed as the engine's own named events: ``sse``).

The request is checked in the order that costs least first: key, Idempotency-Key,
``X-Fairq-Max-Queue-S``, body size, body, model entitlement, the body's fields (only those
the model lets reach its engine: ``broker.engine_fields``), band (an ``X-Fairq-Band``
header, else the body's ``service_tier``: ``broker.tiers``). The job id is generated
before the payload (the engine payload embeds it), the result stream is followed before
the job is queued, and then:

* ``stream: true`` answers ``text/event-stream`` once the first token or the job's
  end is there (``sse``): a job that fails before its first token gets the status
  and error object of the same request not streamed. A client that wants the job id
  (``X-Fairq-Job-Id``) while its job is queued sends ``X-Fairq-Stream-Headers:
  early`` and gets the 200 at once (a later failure is then an error event);
* otherwise the request waits for the body and end events while it watches
  the connection; a client that leaves cancels its job. The answer it would
  have had is never sent; 499 (nginx's "client closed request") is used for it.

Either way the answer says the ``service_tier`` it was served in: the worker writes it
into every chunk and body (``workers.service_tier``), so what is relayed here, and to a
resumed stream, passes as the bytes it is.

A request with an ``Idempotency-Key`` makes its job once per key (``broker.idempotency``:
its fingerprint is the route, the body and the band header). A retry gets the first
try's job: a stream replayed from its start, or from the retry's ``Last-Event-ID``; a
whole answer once it is there. Its answer says ``Idempotent-Replayed: true``.

``X-Fairq-Max-Queue-S`` gives the job a queue deadline of its own, shorter than its
band's (``broker.deadlines``: a longer one is clamped to the band's). It is not part of
the fingerprint: it says how long to wait, counted from the first try, not what to run,
so a retry that sends what is left of it (or none) gets the first try's job, with the
first try's deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from broker import idempotency
from broker.auth import Principal
from broker.deadlines import max_queue_s, own_deadline_ms
from broker.engine_fields import check_fields
from broker.errors import InvalidRequest, UnknownModel
from broker.jobs import RequestKind, Submission, new_job_id
from broker.requests import (
    engine_payload,
    estimate_cost,
    estimate_tokens,
    parse_body,
    stream_mode,
)
from broker.settings import ModelConfig
from broker.tiers import request_band
from gateway.auth import Caller
from gateway.body import read_body, single_header
from gateway.errors import error_response
from gateway.followed import FollowedJob
from gateway.idempotency import idempotency_key, scoped
from gateway.outcomes import ended_error, no_body
from gateway.sse import JobStreamResponse, resume_point
from gateway.state import Gateway, gateway_of

BAND_HEADER = "X-Fairq-Band"
MAX_QUEUE_HEADER = "X-Fairq-Max-Queue-S"
STREAM_HEADERS_HEADER = "X-Fairq-Stream-Headers"
STREAM_HEADERS_HOLD = {"first-event": True, "early": False}  # value -> hold the headers
_CLIENT_CLOSED = 499

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, caller: Caller) -> Response:
    return await _complete(request, caller, RequestKind.CHAT)


@router.post("/v1/completions")
async def completions(request: Request, caller: Caller) -> Response:
    return await _complete(request, caller, RequestKind.COMPLETION)


@router.post("/v1/embeddings")
async def embeddings(request: Request, caller: Caller) -> Response:
    return await _complete(request, caller, RequestKind.EMBEDDING)


@router.post("/v1/responses")
async def responses(request: Request, caller: Caller) -> Response:
    return await _complete(request, caller, RequestKind.RESPONSE)


async def _complete(request: Request, caller: Principal, kind: RequestKind) -> Response:
    gateway = gateway_of(request)
    key = idempotency_key(request)  # None without the header: all it costs then
    max_queue = _max_queue_s(request)
    body = parse_body(kind, await read_body(request, gateway.settings.max_body_bytes))
    band = request.headers.get(BAND_HEADER)
    sub = _submission(gateway, caller, kind, body, band_asked=band, max_queue=max_queue)
    hold = _hold_headers(request.headers.get(STREAM_HEADERS_HEADER))
    if key is None:
        job = await FollowedJob.submit(gateway, sub)
    else:
        job = await _submit_once(request, caller, sub, key, (body, band))
        hold = hold and not job.resumed  # a resumed stream had its 200 (``sse``)
    if sub.stream_flag.to_client:
        return JobStreamResponse(job, hold=hold)
    try:
        return await _wait_for_result(request, job)
    finally:
        await gateway.finish(job.release())


async def _submit_once(
    request: Request, caller: Principal, sub: Submission, key: str, sent: tuple[object, ...]
) -> FollowedJob:
    """The job of a request with an Idempotency-Key: new, or an earlier try's, followed
    from the ``Last-Event-ID`` the retry of a stream may send. ``sent``: what decides the
    job besides the route (the body, the band header), its fingerprint."""
    route = sub.kind.value
    once = scoped(request, caller, key, route, idempotency.fingerprint(route, *sent))
    entry, skip = b"0-0", 0
    if sub.stream_flag.to_client:  # checked before the job is made: a bad id makes none
        entry, skip = resume_point(request.headers.get("last-event-id"))
    return await FollowedJob.submit_once(gateway_of(request), replace(sub, once=once), entry, skip)


def _max_queue_s(request: Request) -> float | None:
    """The request's ``X-Fairq-Max-Queue-S`` in seconds, checked (400 when it is not one:
    ``broker.deadlines``), or None without the header."""
    why = "a request has one deadline"
    value = single_header(request, MAX_QUEUE_HEADER, why, "invalid_max_queue_s")
    return None if value is None else max_queue_s(value, MAX_QUEUE_HEADER)


def _hold_headers(value: str | None) -> bool:
    """Whether a streamed answer holds its headers back for its first event (default)."""
    if value is None:
        return True
    hold = STREAM_HEADERS_HOLD.get(value.strip().lower())
    if hold is None:
        raise InvalidRequest(
            f"{STREAM_HEADERS_HEADER} must be one of {', '.join(STREAM_HEADERS_HOLD)}, "
            f"not {value[:40]!r}",
            code="invalid_stream_headers",
        )
    return hold


def _model(gateway: Gateway, caller: Principal, name: str) -> ModelConfig:
    model = gateway.settings.model(name)
    if model is None or not caller.may_use_model(name):
        raise UnknownModel(
            f"The model `{name}` does not exist or you do not have access to it.", param="model"
        )
    return model


def _submission(
    gateway: Gateway,
    caller: Principal,
    kind: RequestKind,
    body: dict[str, Any],
    *,
    band_asked: str | None,
    max_queue: float | None,
) -> Submission:
    model = _model(gateway, caller, body["model"])
    check_fields(kind, body, model)
    job_id = new_job_id(model.name)
    band = request_band(caller, band_asked, body.get("service_tier"), gateway.tiers)
    return Submission(
        model=model.name,
        owner=caller.user,
        user=caller.end_user(body.get("user")),
        tenant=caller.tenant,
        band=band,
        kind=kind,
        stream_flag=stream_mode(body, model, kind),
        payload=engine_payload(body, job_id, model, kind),
        job_id=job_id,
        cost=estimate_cost(body, model, kind),
        tokens=estimate_tokens(body, model, kind),
        weight=caller.weight,
        max_queue_ms=own_deadline_ms(max_queue, band, gateway.settings.queue_deadline_s),
    )


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: nothing else comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _wait_for_result(request: Request, job: FollowedJob) -> Response:
    result = asyncio.ensure_future(job.result())
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait((result, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (result, gone):
            task.cancel()
        await asyncio.gather(result, gone, return_exceptions=True)
    if result.cancelled() or result.exception() is not None:
        return Response(status_code=_CLIENT_CLOSED)  # job.ended is False: release cancels it
    body, end = result.result()
    headers = job.headers()
    error = ended_error(end, job.id) or (no_body() if body is None else None)
    if error is not None:
        return error_response(error, headers)
    return Response(body, 200, headers, media_type="application/json")
