"""``position.lua``: how many jobs of its user's queue are ahead of a queued job."""

from __future__ import annotations

from typing import Any

from broker import keys
from broker.lua import Call, script

_SCRIPT = script("position")


def position_call(model: str, job_id: str, band: str, user: str, most: int) -> Call[int | None]:
    """``most``: a bound on the work of one call. Its reply: the jobs ahead (at most
    ``most``), None when the job is not queued."""
    job_keys = [keys.job(model, job_id), keys.queue(model, band, user)]
    return Call(_SCRIPT, job_keys, [most], _ahead)


def _ahead(reply: Any) -> int | None:
    return None if int(reply) < 0 else int(reply)
