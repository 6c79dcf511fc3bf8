"""``park.lua``: take one job of the heaviest user at an endpoint back out of the engine."""

from __future__ import annotations

from typing import Any, NamedTuple

from broker import keys
from broker.lua import Call, script
from broker.redis.resp import Arg

_SCRIPT = script("park")


class Parked(NamedTuple):
    """A job taken back out of the engine, to the head of its user's queue."""

    job_id: str
    user: str


def park_call(
    model: str,
    endpoint: str,
    *,
    scan: int,
    min_jobs: int,
    from_text: bool = False,
    young_ms: int = 0,
) -> Call[Parked | None]:
    """``scan``: the newest ready entries to look at; ``min_jobs``: the fewest jobs a user
    must have at the endpoint to lose one; ``from_text``: a resumable job without token ids
    may go on from its text; ``young_ms`` > 0: only a job without output handed over
    within that many ms (one that may still wait for its prefill). Its reply: the job
    taken back, or None."""
    m = model
    model_keys = [keys.ready(m), keys.inflight(m), keys.unstarted(m), keys.user_counts(m)]
    model_keys += [keys.transit(m), keys.queued_counts(m), keys.meta(m)]
    args: list[Arg] = [endpoint, keys.job_prefix(m), keys.READY_GROUP, keys.parked_prefix(m)]
    args += [keys.backlog_prefix(m), scan, min_jobs, keys.wake_channel(m)]
    args += [keys.cancel_channel(m), keys.results_prefix(m), int(from_text), young_ms]
    return Call(_SCRIPT, model_keys, args, _parked)


def _parked(reply: Any) -> Parked | None:
    return Parked(reply[0].decode(), reply[1].decode()) if reply else None
