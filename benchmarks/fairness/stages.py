"""Where a light user's wait goes in a fairq arm, read from its jobs' records after the flood.

Each job's hash holds the times of its moves (``broker.job_fields``): queued, dispatched
(the dispatcher admitted it, after taking a flood job back where it had to), started (a
worker has it and calls the engine) and its first output (the worker got the engine's
first token). So a light request's TTFT splits into:

- ``queue``: in fairq's queue, until the dispatcher admits it;
- ``hand_over``: from the ready stream to a worker that starts it;
- ``engine``: from the worker's call to the engine's first token: the engine's own
  queue, the wait for a slot (an aborted flood answer's slot frees at the engine's next
  step), and the step that prefills the request;
- the rest of the client's TTFT (``gateway``): the gateway's enqueue and the first
  token's way back to the client, the client's HTTP connection included.

The flood's requests (``flood_summary``) wait in fairq's queue by design; once sent (most
of them refills of a freed slot), their hand-over and engine stages say how long a refill
takes to start, and their send times how fast the dispatcher refilled.

Times come from Redis's clock and the worker's (one host here); medians and maxima in ms.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from redis import Redis

from benchmarks.lib.stats import median
from broker import job_fields, keys

_TIMES = (job_fields.QUEUED_MS, job_fields.DISPATCHED_MS, job_fields.STARTED_MS,
          job_fields.FIRST_TOKEN_MS)  # fmt: skip
STAGES = ("queue", "hand_over", "engine")
SENT_STAGES = STAGES[1:]  # once the dispatcher sent it


def stages_of(times: Sequence[int]) -> dict[str, int]:
    """One job's stages from its queued, dispatched, started and first-output times."""
    return {stage: times[i + 1] - times[i] for i, stage in enumerate(STAGES)}


def summary(jobs: Iterable[dict[str, Any]], ttfts_ms: Sequence[float]) -> dict[str, Any]:
    """Median and maximum of each stage over ``jobs``, and the rest of the client's median
    TTFT (``ttfts_ms``, the same requests) as ``gateway``."""
    jobs = list(jobs)
    if not jobs:
        return {}
    out = _spread(jobs, STAGES)
    inside = median([sum(j[stage] for stage in STAGES) for j in jobs])
    out["gateway"] = {"p50": median(ttfts_ms) - inside if ttfts_ms else None}
    out["jobs"] = len(jobs)
    return out


def flood_summary(jobs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Median and maximum of the hand-over and engine stages of the flood's ``jobs``, and
    how many the dispatcher sent a second from its first send to its last."""
    jobs = list(jobs)
    if len(jobs) < 2:
        return {}
    out = _spread(jobs, SENT_STAGES)
    sent = [j["dispatched_ms"] for j in jobs]
    span_s = (max(sent) - min(sent)) / 1000
    out["sent_per_s"] = (len(jobs) - 1) / span_s if span_s > 0 else None
    out["jobs"] = len(jobs)
    return out


def _spread(jobs: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Median and maximum of each of the stages ``names`` over ``jobs``."""
    return {
        stage: {"p50": median([j[stage] for j in jobs]), "max": max(j[stage] for j in jobs)}
        for stage in names
    }


def job_stages(redis_url: str, model: str, users: Sequence[str]) -> list[dict[str, Any]]:
    """The stages of every ended job of ``users`` at ``model`` in that Redis, each with
    its ``user`` and when it was dispatched (``dispatched_ms``, Redis's clock)."""
    redis = Redis.from_url(redis_url)
    wanted = {user.encode() for user in users}
    found = []
    try:
        for key in redis.scan_iter(keys.job(model, "*"), count=1000):
            user, *times = redis.hmget(key, [job_fields.USER, *_TIMES])
            ms = [int(t) for t in times if t is not None]
            if user in wanted and len(ms) == len(_TIMES):
                found.append({"user": user.decode(), "dispatched_ms": ms[1], **stages_of(ms)})
    finally:
        redis.close()
    return found
