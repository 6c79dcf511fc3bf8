"""``reroute.lua``: hand back a job whose engine never took it, to be dispatched elsewhere."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from broker import keys
from broker.lua import Call, script
from broker.redis.resp import Arg

_SCRIPT = script("reroute")


class Reroute(enum.StrEnum):
    """What became of a job a worker handed back."""

    REROUTED = "rerouted"  # queued again at the head of its user's line
    EXHAUSTED = "exhausted"  # handed back the most times allowed: the worker ends it failed
    OUTPUT = "output"  # its result stream holds output: a rerun would repeat text
    STALE = "stale"  # not this attempt's any more (ended, taken back, reclaimed): drop it


class Rerouted(NamedTuple):
    outcome: Reroute
    times: int  # the job's hand-backs so far (this one included when REROUTED)


def reroute_call(
    model: str,
    job_id: str,
    *,
    band: str,
    user: str,
    worker: str,
    attempt_entry: bytes | str,
    max_reroutes: int,
) -> Call[Rerouted]:
    """``attempt_entry``: the ready entry of ``worker``'s attempt (the job must still be
    running under it, from that entry); ``max_reroutes``: the most hand-backs per job."""
    m = model
    job_keys = [keys.job(m, job_id), keys.results(m, job_id), keys.ready(m), keys.inflight(m)]
    job_keys += [keys.unstarted(m), keys.transit(m), keys.user_counts(m), keys.queued_counts(m)]
    job_keys += [keys.meta(m), keys.backlog(m, band), keys.parked(m, band, user), keys.handed(m)]
    args: list[Arg] = [worker, attempt_entry, keys.READY_GROUP, max_reroutes, band, user]
    args += [job_id, keys.wake_channel(m)]
    return Call(_SCRIPT, job_keys, args, _rerouted)


def _rerouted(reply: Any) -> Rerouted:
    return Rerouted(Reroute(reply[0].decode()), int(reply[1]))
