"""``enqueue.lua``: queue a new job, or send it express under a live grant."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

from broker import keys
from broker.jobs import Submission
from broker.lua import Call, script
from broker.redis.resp import Arg

_SCRIPT = script("enqueue")


class Route(enum.IntEnum):
    """How the job went on: the reply's first element."""

    EXISTS = -1  # its id exists already (a retried submit): nothing changed
    FULL = 0  # the user's queue is full: nothing changed
    QUEUED = 1
    EXPRESS = 2  # straight to the ready stream


class Enqueued(NamedTuple):
    route: Route
    queued: int = 0  # FULL: the jobs the user has queued

    @property
    def full(self) -> bool:
        return self.route is Route.FULL


def enqueue_call(
    sub: Submission,
    job_id: str,
    *,
    max_queued: int,
    bands: Sequence[str],
    ready_maxlen: int,
    engine_priority: bool,
    resumable: bool,
    keep_s: int | None = None,
) -> Call[Enqueued]:
    """``bands``: every band, in priority order; ``engine_priority``: give the job an engine
    priority; ``resumable``: streamed, and may go on from its text if taken back mid-answer;
    ``keep_s``: keep the ended job this long (a batch line), not the results' TTL."""
    m, band, user = sub.model, sub.band, sub.user
    # One list each: every request runs it.
    job_keys = [
        keys.job(m, job_id),
        keys.queue(m, band, user),
        keys.backlog(m, band),
        keys.meta(m),
        keys.queued_counts(m),
        keys.ready(m),
        keys.inflight(m),
        keys.unstarted(m),
        keys.user_counts(m),
        keys.transit(m),
    ]
    args: list[Arg] = [
        job_id,
        user,
        sub.tenant,
        band,
        sub.kind.value,
        sub.stream_flag,
        sub.payload,
        max_queued,
        keys.wake_channel(m),
        keys.join_field(band),
        sub.owner,
        sub.cost,
        sub.weight,
        keys.tenant_field(band, sub.tenant),
        ready_maxlen,
        int(engine_priority),
        bands.index(band) + 1,
        len(bands),
        *bands,
        *(keys.grant_field(b) for b in bands),
        keep_s or "",
        int(resumable),
    ]
    return Call(_SCRIPT, job_keys, args, _enqueued)


_ROUTE = {route.value: route for route in Route}  # a look-up: every request decodes one


def _enqueued(reply: Any) -> Enqueued:
    route = _ROUTE[reply[0]]
    return Enqueued(route, int(reply[1]) if route is Route.FULL else 0)
