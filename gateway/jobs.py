"""``/v1/jobs/{id}``: a caller's own jobs. Another user's job is reported as not found
(never as forbidden), so ids cannot be probed.

``GET /v1/jobs/{id}/stream`` resumes a streamed job's events: send the id of the
last event received as ``Last-Event-ID`` (or none, for everything from the
start); the answer is the events after it, then the job's end, as the original
stream would have gone on. ``GET /v1/admin/dead-letters`` lists the jobs ended as
dead letters (admin keys only).
"""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import Response

from broker.errors import Forbidden, NotFound, UnknownModel
from broker.execution import ExecutionStore
from gateway.auth import Caller
from gateway.errors import json_response
from gateway.followed import FollowedJob
from gateway.sse import JobStreamResponse, resume_point
from gateway.state import gateway_of

router = APIRouter()


@router.get("/v1/jobs/{job_id}")
async def get_job(job_id: str, request: Request, caller: Caller) -> Response:
    """The job; a queued job also says how many jobs go before it and the estimated wait."""
    queue = gateway_of(request).queue
    job = await queue.get(job_id, caller.user)
    body = job.public()
    position = await queue.position(job)
    if position is not None:
        body["queue_position"] = position.public()
    return json_response(body)


@router.get("/v1/jobs/{job_id}/stream")
async def resume_stream(
    job_id: str,
    request: Request,
    caller: Caller,
    last_event_id: str | None = Header(default=None, alias="Last-Event-ID"),
) -> Response:
    """The job's stream from just after event ``Last-Event-ID``: nothing twice, no gaps."""
    gateway = gateway_of(request)
    entry, skip = resume_point(last_event_id)
    job = await gateway.queue.get(job_id, caller.user)
    return JobStreamResponse(await FollowedJob.resume(gateway, job, caller.user, entry, skip))


@router.delete("/v1/jobs/{job_id}")
async def cancel_job(job_id: str, request: Request, caller: Caller) -> Response:
    """Cancel the job unless it has ended; answers with the record as it is afterwards."""
    job = await gateway_of(request).queue.cancel(job_id, caller.user)
    return json_response(job.public())


@router.get("/v1/admin/dead-letters")
async def dead_letters(
    request: Request,
    caller: Caller,
    model: str = Query(description="the model whose dead letters to list"),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Response:
    """The newest jobs ended as dead letters (each kept until it expires, result_ttl_s)."""
    if not caller.admin:
        raise Forbidden("listing dead letters needs an admin API key")
    gateway = gateway_of(request)
    if gateway.settings.model(model) is None:
        raise UnknownModel(f"The model `{model}` does not exist.")
    store = ExecutionStore(gateway.redis, gateway.settings)
    rows = await store.dead_letters(model, limit)
    data = []
    for job_id, _when in rows:
        with contextlib.suppress(NotFound):  # expired since: the index trims it later
            record = await gateway.queue.get(job_id, None)
            data.append(record.public() | {"user": record.user})
    return json_response({"object": "list", "data": data})
