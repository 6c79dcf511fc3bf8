"""``start.lua``: a worker takes a dispatched job it read from the ready stream."""

from __future__ import annotations

from typing import Any

from broker import keys
from broker.lua import Call, script

_SCRIPT = script("start")


def start_call(
    model: str, job_id: str, worker: str, handed_keep_ms: int, *, accepted: bool = False
) -> Call[int | None]:
    """``handed_keep_ms``: how long the start stays in the handed zset; ``accepted``: the
    engine accepted the streamed request (adds the acceptance mark). Its reply: the job's
    attempt number, now running under ``worker``; None when it is no longer startable (it
    ended meanwhile, or is gone) and the worker must drop it."""
    job_keys = [
        keys.job(model, job_id),
        keys.transit(model),
        keys.handed(model),
        keys.results(model, job_id),
    ]
    args: list[str | int] = [worker, job_id, handed_keep_ms, int(accepted)]
    return Call(_SCRIPT, job_keys, args, _attempt)


def _attempt(reply: Any) -> int | None:
    return int(reply[1]) if reply[0] == 1 else None
