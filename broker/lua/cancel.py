"""``cancel.lua``: end a job as cancelled (or expired), wherever it is, unless it has ended."""

from __future__ import annotations

from typing import Any

from broker import keys
from broker.jobs import JobState
from broker.lua import Call, script

_SCRIPT = script("cancel")


def cancel_call(
    model: str, job_id: str, *, band: str, user: str, state: JobState, ttl_s: int
) -> Call[JobState | None]:
    """``state``: the terminal state to record. Its reply: the state the job was in
    (terminal: it had ended), None if there is no such job."""
    m = model
    job_keys = [keys.job(m, job_id), keys.results(m, job_id), keys.ready(m), keys.inflight(m)]
    job_keys += [keys.queue(m, band, user), keys.backlog(m, band), keys.unstarted(m)]
    job_keys += [keys.user_counts(m), keys.queued_counts(m), keys.meta(m), keys.transit(m)]
    job_keys.append(keys.parked(m, band, user))
    channels = [keys.wake_channel(m), keys.cancel_channel(m)]
    args = [job_id, keys.READY_GROUP, ttl_s, *channels, user, state.value, band]
    return Call(_SCRIPT, job_keys, args, _state)


def _state(reply: Any) -> JobState | None:
    return JobState(reply.decode()) if reply else None
