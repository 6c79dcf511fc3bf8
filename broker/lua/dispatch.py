"""``dispatch.lua``: move the planned users' head jobs to the ready stream, for one endpoint,
and read the model's state right after."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker import keys
from broker.lua import Call, script
from broker.redis.resp import Arg

_SCRIPT = script("dispatch")


@dataclass(frozen=True)
class Pick:
    """One planned dispatch: serve ``user``'s head job in ``band``, then rescore."""

    band: str
    user: str
    score_after: float | None  # None: charge the job's estimated cost (token-fair)
    join_after: float


class DispatchReply(NamedTuple):
    ids: list[str]  # the jobs dispatched, in plan order (emptied queues skipped)
    backlogs: list[list[Any]]  # per band: user, score, ... (the lowest ``depth`` scores)
    meta: list[bytes | None]  # the bands' join scores, then the express sequence 'xs'
    inflight: list[bytes]  # endpoint, count, ...
    unstarted: list[bytes]  # endpoint, count, ...
    plain: int  # how many of the jobs are not streamed
    in_engine: list[list[bytes | None]]  # with ``served_cap``: per band, per reported user


def dispatch_call(
    model: str,
    endpoint: str,
    *,
    cap: int,
    picks: Sequence[Pick],
    depth: int,
    bands: Sequence[str],
    ready_maxlen: int,
    engine_priority: bool,
    rate: float | None,
    served_cap: int | None,
) -> Call[DispatchReply]:
    """``cap``: the endpoint's in-flight cap; ``depth``: users reported per band; ``bands``:
    every band, in priority order; ``rate``: the model's recent dispatch rate (jobs/s),
    kept in meta; ``served_cap``: the in-flight cap for users with a job in the engine."""
    m, n = model, len(bands)
    args: list[Arg] = [endpoint, keys.job_prefix(m), ready_maxlen, cap, depth, n]
    args += [int(engine_priority), "" if rate is None else rate]
    args += ["" if served_cap is None else served_cap, int(served_cap is not None)]
    args += [keys.parked_prefix(m), *(keys.join_field(band) for band in bands), *bands]
    for p in picks:
        score = "cost" if p.score_after is None else p.score_after
        args += [bands.index(p.band) + 1, p.user, score, p.join_after]
    fixed = [keys.ready(m), keys.inflight(m), keys.meta(m), keys.unstarted(m)]
    fixed += [keys.user_counts(m), keys.queued_counts(m), keys.transit(m)]
    backlogs = [keys.backlog(m, band) for band in bands]
    queues = [keys.queue(m, p.band, p.user) for p in picks]
    counted = n if served_cap is not None else 0

    def decode(reply: Any) -> DispatchReply:
        counts = reply[len(reply) - counted :]
        ids, *ranges, meta, inflight, unstarted, plain = reply[: len(reply) - counted]
        dispatched = [job_id.decode() for job_id in ids if job_id]
        return DispatchReply(dispatched, ranges, meta, inflight, unstarted, int(plain), counts)

    return Call(_SCRIPT, fixed + backlogs + queues, args, decode)
