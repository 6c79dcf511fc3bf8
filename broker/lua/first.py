"""``first.lua``: a job's first output reached its result stream; it no longer waits to start."""

from __future__ import annotations

from broker import keys
from broker.lua import Call, one, script

_SCRIPT = script("first")


def first_call(model: str, job_id: str) -> Call[bool]:
    """Its reply: whether this call took the job off its endpoint's unstarted count."""
    job_keys = [keys.job(model, job_id), keys.unstarted(model)]
    return Call(_SCRIPT, job_keys, [keys.wake_channel(model)], one)
