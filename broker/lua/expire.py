"""``expire.lua``: end the jobs of one band that waited in the queue past their deadline
(the band's, or their own: ``broker.deadlines``)."""

from __future__ import annotations

from typing import Any, NamedTuple

from broker import keys
from broker.lua import Call, script
from broker.redis.resp import Arg

_SCRIPT = script("expire")


class Expired(NamedTuple):
    next_rank: int  # the backlog rank the next call starts from; -1: the walk is done
    job_ids: list[str]


def expire_call(
    model: str,
    band: str,
    *,
    deadline_ms: int | None,
    ttl_s: int,
    budget: int,
    rank: int,
    users: int,
) -> Call[Expired]:
    """``deadline_ms``: the band's (None: it has none, and only jobs' own deadlines end);
    ``ttl_s``: of the jobs ended; ``budget``: the most jobs to end; ``users``: how many
    users to look at, from backlog rank ``rank``."""
    m = model
    model_keys = [keys.backlog(m, band), keys.queued_counts(m), keys.meta(m)]
    model_keys.append(keys.own_deadlines(m, band))
    args: list[Arg] = [keys.queue_prefix(m, band), keys.job_prefix(m), keys.results_prefix(m)]
    band_ms = "" if deadline_ms is None else deadline_ms
    args += [band, band_ms, ttl_s, keys.wake_channel(m), budget, rank, users]
    args.append(keys.parked(m, band, ""))
    return Call(_SCRIPT, model_keys, args, _expired)


def _expired(reply: Any) -> Expired:
    return Expired(int(reply[0]), [job_id.decode() for job_id in reply[1:]])
