"""``enqueue.lua``: queue a new job, or send it express under a live grant; charge it to
its quotas (``broker.quotas``) in the same call, or refuse it."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

from broker import keys
from broker.jobs import Submission
from broker.lua import Call, script
from broker.quotas import Quota, Reading, reading
from broker.redis.resp import Arg

_SCRIPT = script("enqueue")


class Route(enum.IntEnum):
    """How the job went on: the reply's first element."""

    REUSED = -2  # its Idempotency-Key made a job for another request: nothing changed
    EXISTS = -1  # its id exists already (a retried submit): nothing changed
    FULL = 0  # the user's queue is full: nothing changed
    QUEUED = 1
    EXPRESS = 2  # straight to the ready stream
    REPLAYED = 3  # its Idempotency-Key made a job for this request already: nothing changed
    OVER_QUOTA = 4  # a limit of its quotas would be passed: nothing changed


class Enqueued(NamedTuple):
    route: Route
    queued: int = 0  # FULL: the jobs the user has queued
    made: str = ""  # REPLAYED, REUSED: the id of the job the Idempotency-Key made
    quota: Reading | None = None  # with quotas: how the call left them

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
    quotas: Sequence[Quota] = (),
    batch_line: bool = False,
) -> Call[Enqueued]:
    """``bands``: every band, in priority order; ``engine_priority``: give the job an engine
    priority; ``resumable``: streamed, and may go on from its text if taken back mid-answer;
    ``keep_s``: keep the ended job this long (a batch line), not the results' TTL;
    ``quotas``: those the job counts against (its estimate is ``sub.tokens``), and
    ``batch_line``: never refused by them, charged as it ends."""
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
        keys.own_deadlines(m, band),
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
        sub.max_queue_ms or "",
    ]
    if sub.once is not None:  # KEYS[12], ARGV[22+2B], ARGV[23+2B]
        job_keys.append(sub.once.job_record(m))
        args += (sub.once.fingerprint, sub.once.window_s)
    if not quotas:
        return Call(_SCRIPT, job_keys, args, _enqueued)
    if sub.once is None:
        args += ("", "")
    args += (len(quotas), sub.tokens, int(batch_line))  # ARGV[24+2B .. 26+2B]
    for quota in quotas:  # the last KEYS, and four ARGV each
        job_keys.append(quota.key)
        args += ("" if limit is None else limit for limit in quota.limits())
    return Call(_SCRIPT, job_keys, args, partial(_with_quota, quotas, sub.tokens))


_ROUTE = {route.value: route for route in Route}  # a look-up: every request decodes one


def _enqueued(reply: Any) -> Enqueued:
    route = _ROUTE[reply[0]]
    if route is Route.QUEUED or route is Route.EXPRESS:
        return Enqueued(route)
    if route is Route.FULL:
        return Enqueued(route, int(reply[1]))
    if route is Route.EXISTS or route is Route.OVER_QUOTA:
        return Enqueued(route)
    made = reply[1]
    return Enqueued(route, made=made.decode() if isinstance(made, bytes) else str(made))


def _with_quota(quotas: Sequence[Quota], tokens: int, reply: Any) -> Enqueued:
    """A reply with quotas: the route and its value, then their reading."""
    return _enqueued(reply)._replace(quota=reading(reply[2:], quotas, tokens))
