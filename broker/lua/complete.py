"""``complete.lua``: record a running job's terminal state exactly once and release it."""

from __future__ import annotations

from broker import keys
from broker.jobs import JobState
from broker.lua import Call, one, script
from broker.redis.resp import Arg

_SCRIPT = script("complete")


def complete_call(
    model: str,
    job_id: str,
    *,
    band: str,
    user: str,
    worker: str,
    state: JobState,
    ttl_s: int,
    error: str,
    usage: str,
    finish_reason: str,
    first_token_ms: int | None,
    prompt_cost: float,
    output_cost: float,
    dead_letter: bool,
    attempt_entry: bytes | str = "",
) -> Call[bool]:
    """``worker``: '' from a caller that is no worker (no check of who holds the job);
    ``attempt_entry``: the ready entry of the worker's attempt ('': no check that the job
    was not taken back and dispatched again meanwhile);
    ``state``: completed or failed; ``ttl_s``: of the job and its results; ``error`` and
    ``usage``: JSON or ''; the costs of a prompt and an output token correct a token-fair
    charge to the usage; ``dead_letter``: record the job in the dead-letter index. Its
    reply: whether this call ended the job (not: it had ended, or another worker holds it)."""
    m = model
    job_keys = [
        keys.job(m, job_id),
        keys.results(m, job_id),
        keys.ready(m),
        keys.inflight(m),
        keys.unstarted(m),
        keys.backlog(m, band),
        keys.user_counts(m),
        keys.dead_letters(m),
        keys.transit(m),
    ]
    args: list[Arg] = [
        state.value,
        keys.READY_GROUP,
        ttl_s,
        keys.wake_channel(m),
        error,
        usage,
        finish_reason,
        first_token_ms or "",
        prompt_cost,
        output_cost,
        user,
        worker,
        job_id if dead_letter else "",
        attempt_entry,
    ]
    return Call(_SCRIPT, job_keys, args, one)
