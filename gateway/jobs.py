"""``/v1/jobs/{id}``: a caller's own jobs. Another user's job is reported as not found
(never as forbidden), so ids cannot be probed.

A queued job also says where it stands (``queue_position``) and whether its model can
serve it now (``model_state``): "starting" while the model's dispatcher sees no ready
engine endpoint (its engines are at zero and being woken, or none answers), so the job
waits for an engine to start; its wait estimate is then ``null``, since what it waits
for is the start-up, not the queue's drain. A ``null`` estimate always comes with
``estimated_wait_reason``, which says why (``broker.position``).

``GET /v1/jobs/{id}/stream`` resumes a streamed job's events: send the id of the
last event received as ``Last-Event-ID`` (or none, for everything from the
start); the answer is the events after it, then the job's end, as the original
stream would have gone on. ``GET /v1/admin/dead-letters`` lists the jobs ended as
dead letters (admin keys only, ``auth.Admin``; left out of the OpenAPI document).
"""

from __future__ import annotations

import contextlib
from typing import Literal

from fastapi import APIRouter, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from broker.demand import read_model_state
from broker.errors import NotFound, UnknownModel
from broker.execution import ExecutionStore
from broker.jobs import JobRecord
from gateway.auth import Admin, Caller
from gateway.errors import json_response
from gateway.followed import FollowedJob
from gateway.outcomes import shown_error
from gateway.sse import JobStreamResponse, resume_point
from gateway.state import gateway_of

router = APIRouter()


class QueuePositionView(BaseModel):
    jobs_ahead: int = Field(description="jobs dispatched before this one, as things stand")
    estimated_wait_s: float | None = Field(
        description="seconds until it is dispatched; null when fairq cannot back a figure "
        "(estimated_wait_reason says why), and while the model is starting (the wait is the "
        "engine's start-up)"
    )
    estimated_wait_reason: str | None = Field(
        description="why estimated_wait_s is null, e.g. no job of the model has run yet, or "
        "the model is starting; null when it is a number"
    )


class JobView(BaseModel):
    """The fields of a job a client acts on (the body has more: see the README)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["fairq.job"]
    model: str
    status: Literal["queued", "dispatched", "running", "completed", "failed", "cancelled",
                    "expired"]  # fmt: skip
    queue_position: QueuePositionView | None = Field(default=None, description="a queued job only")
    model_state: Literal["ready", "starting"] | None = Field(
        default=None,
        description="a queued job only: 'starting' while the model has no ready engine "
        "endpoint (scaled to zero and waking, or none answering): the job waits in the "
        "queue for one to start; 'ready' when one is; null when unknown (no dispatcher)",
    )


@router.get("/v1/jobs/{job_id}", responses={200: {"model": JobView}})
async def get_job(job_id: str, request: Request, caller: Caller) -> Response:
    """The job; a queued job also says how many jobs go before it, the estimated wait,
    and whether its model is ready or starting."""
    gateway = gateway_of(request)
    job = await gateway.queue.get(job_id, caller.user)
    body = _public(job)
    position = await gateway.queue.position(job)
    if position is not None:
        state = await read_model_state(gateway.redis, job.model)
        if state == "starting":  # the queue's drain says nothing of an engine's start-up
            position = position.starting()
        body["queue_position"] = position.public()
        body["model_state"] = state
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
    return json_response(_public(job))


def _public(job: JobRecord) -> dict[str, object]:
    """The job as its owner sees it: a failure without the server's detail (``outcomes``)."""
    return job.public() | {"error": shown_error(job.error, job.id)}


@router.get("/v1/admin/dead-letters", include_in_schema=False)
async def dead_letters(
    request: Request,
    caller: Admin,
    model: str = Query(description="the model whose dead letters to list"),
    limit: int = Query(default=100, ge=1, le=1000),
) -> Response:
    """The newest jobs ended as dead letters (each kept until it expires, result_ttl_s)."""
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
