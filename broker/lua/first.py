"""``first.lua``: a job's first output reached its result stream; it no longer waits to start."""

from __future__ import annotations

from broker import keys
from broker.lua import Call, one, script
from broker.redis.resp import Arg

_SCRIPT = script("first")


def first_call(model: str, job_id: str, first_ms: int | None) -> Call[bool]:
    """``first_ms``: the worker's time of the first output, kept as the job's first-token
    time (None: the job reached its engine but has no first token yet). Its reply: whether
    this call took the job off its endpoint's unstarted count."""
    job_keys = [keys.job(model, job_id), keys.unstarted(model)]
    args: list[Arg] = [keys.wake_channel(model), "" if first_ms is None else first_ms]
    return Call(_SCRIPT, job_keys, args, one)
