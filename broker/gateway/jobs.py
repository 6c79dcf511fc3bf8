"""``/v1/jobs/{id}``: a caller's own jobs. Another user's job is reported as not found
(never as forbidden), so ids cannot be probed."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from broker.gateway.auth import Caller
from broker.gateway.errors import json_response
from broker.gateway.state import gateway_of

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


@router.delete("/v1/jobs/{job_id}")
async def cancel_job(job_id: str, request: Request, caller: Caller) -> Response:
    """Cancel the job unless it has ended; answers with the record as it is afterwards."""
    job = await gateway_of(request).queue.cancel(job_id, caller.user)
    return json_response(job.public())
