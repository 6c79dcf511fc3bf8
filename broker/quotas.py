"""Quotas: tokens and requests per UTC minute and per UTC day, of a tenant and of a user
(the ``quotas`` setting), shared by every gateway through Redis.

The windows are fixed: the UTC minute and the UTC day, numbered from the epoch. A
tenant's or a user's counters are one hash (``keys.tenant_quota``, ``keys.user_quota``)
holding the minute and the day it counts and the tokens and requests of each; a window
that has passed counts 0 (prelude.lua's ``quota_counts``). A fixed window is exact and
cheap: a job's tokens count in the window it was queued in, and nowhere else, so the
counters of a window are the sum of its jobs. Its price is the boundary: a burst at the
end of one minute and another at the start of the next may together take up to twice a
minute's limit within a few seconds (a sliding window would not, at the cost of a
sorted set of every job per scope).

Who changes a counter, and when (each in the Lua call that moves the job, so no count
drifts between gateways, nor when one dies):

    queued    enqueue.lua: the job's estimate (``requests.estimate_tokens``) and one request, in
              every window of its quotas, or a refusal (``Route.OVER_QUOTA``) with nothing
              charged when any limit would be passed: what is admitted, estimated, never
              passes a limit. The job keeps what it was charged ('qc'), when ('qm') and
              where ('q1', 'q2': the counters' keys).
    terminal  prelude.lua's ``finish`` (complete, cancel, expire), exactly once: the
              charge is corrected by its usage minus its estimate; one that never produced
              output (expired, cancelled or failed before its first token) is refunded,
              its request too; one that produced output but reported no usage (cancelled
              mid-answer) keeps its estimate. Only in the windows it was charged in, while
              they are still counted: a passed window keeps what it had.

A batch line is never refused: it is charged its usage (one request) as it ends, in the
day it ends and not the minute: batches count against the daily limits as their lines run.

Counters live in Redis like the jobs: a gateway's restart loses nothing, and a Redis
restart keeps what its append-only file kept, the jobs and their charges together
(docs/operations.md, "What fairq expects of Redis").
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from broker import keys

MINUTE_MS = 60_000  # prelude.lua's MINUTE_MS and DAY_MS
DAY_MS = 86_400_000
# A quota's counters (keys.tenant_quota), in prelude.lua's quota_counts order: the minute
# counted, its tokens and requests, the day counted, its tokens and requests.
COUNTER_FIELDS = ("mi", "mt", "mr", "di", "dt", "dr")


class Unit(enum.Enum):
    TOKENS = "tokens"
    REQUESTS = "requests"


class Window(enum.Enum):
    MINUTE = MINUTE_MS
    DAY = DAY_MS

    def reset_ms(self, now_ms: int) -> int:
        """Time from ``now_ms`` until this window of now ends (and counts 0 again)."""
        return self.value - now_ms % self.value

    @property
    def per(self) -> str:
        return "min" if self is Window.MINUTE else "day"


# The order of a quota's limits in enqueue.lua's ARGV and of its counts in the reply.
_LIMITS = (
    (Unit.TOKENS, Window.MINUTE, "tokens_per_minute"),
    (Unit.TOKENS, Window.DAY, "tokens_per_day"),
    (Unit.REQUESTS, Window.MINUTE, "requests_per_minute"),
    (Unit.REQUESTS, Window.DAY, "requests_per_day"),
)


class QuotaLimits(Protocol):
    """What a quota reads of its entry of the settings (``broker.settings.QuotaConfig``:
    a shape, not the class, so that ``broker.errors``, which the settings import, may
    name a ``Reading``)."""

    @property
    def tenant(self) -> str | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def scope(self) -> str: ...
    @property
    def tokens_per_minute(self) -> int | None: ...
    @property
    def tokens_per_day(self) -> int | None: ...
    @property
    def requests_per_minute(self) -> int | None: ...
    @property
    def requests_per_day(self) -> int | None: ...


@dataclass(frozen=True)
class Quota:
    """One tenant's or user's limits, and the key of its counters."""

    key: str
    config: QuotaLimits

    @classmethod
    def of(cls, config: QuotaLimits) -> Quota:
        """The quota of a tenant's or a user's entry, with its counters' key."""
        if config.tenant is not None:
            return cls(keys.tenant_quota(config.tenant), config)
        return cls(keys.user_quota(str(config.user)), config)

    def limits(self) -> list[int | None]:
        """Its limits in enqueue.lua's order (None: no such limit)."""
        return [getattr(self.config, name) for _, _, name in _LIMITS]


class QuotaBook:
    """The quotas of the settings by tenant and by user; built once."""

    def __init__(self, quotas: Sequence[QuotaLimits]) -> None:
        self._tenants = {q.tenant: Quota.of(q) for q in quotas if q.tenant}
        self._users = {q.user: Quota.of(q) for q in quotas if q.user}

    def of(self, tenant: str, user: str) -> tuple[Quota, ...]:
        """The quotas a job of ``tenant`` and (the key's) ``user`` counts against."""
        # Every request asks: two look-ups, no generator.
        of_tenant, of_user = self._tenants.get(tenant), self._users.get(user)
        if of_tenant is None:
            return () if of_user is None else (of_user,)
        return (of_tenant,) if of_user is None else (of_tenant, of_user)


class Counts(NamedTuple):
    """A quota's counters in the windows of now, in enqueue.lua's order."""

    tokens_minute: int
    tokens_day: int
    requests_minute: int
    requests_day: int


def counts_now(counters: Sequence[bytes | str | int | None], now_ms: int) -> Counts:
    """A quota's counters as ``HMGET`` of ``COUNTER_FIELDS`` returns them, in the windows
    of ``now_ms``: a window that has passed (or was never counted) counts 0, as
    prelude.lua's ``quota_counts`` reads it, since the next charge starts it again."""
    mi, mt, mr, di, dt, dr = (None if v is None else int(v) for v in counters)
    minute, day = mi == now_ms // MINUTE_MS, di == now_ms // DAY_MS
    return Counts(
        (mt or 0) if minute else 0,
        (dt or 0) if day else 0,
        (mr or 0) if minute else 0,
        (dr or 0) if day else 0,
    )


class Use(NamedTuple):
    """One limit of a quota now: what its window has used, and when it counts 0 again."""

    name: str  # the setting: tokens_per_minute, tokens_per_day, requests_per_...
    used: int
    limit: int
    reset_ms: int

    @property
    def remaining(self) -> int:
        # A job's usage may pass its estimate, and so the limit: nothing is left, not less.
        return max(0, self.limit - self.used)


def uses(quota: Quota, counts: Counts, now_ms: int) -> list[Use]:
    """Each limit the quota has, in enqueue.lua's order, with what ``counts`` used of it."""
    return [
        Use(name, used, limit, window.reset_ms(now_ms))
        for (_, window, name), limit, used in zip(_LIMITS, quota.limits(), counts, strict=True)
        if limit is not None
    ]


class Standing(NamedTuple):
    """Where a request leaves one unit: OpenAI's ``x-ratelimit-*`` of it."""

    limit: int
    remaining: int
    reset_ms: int


class Refusal(NamedTuple):
    """Why a request was refused: the limit it would pass that frees last."""

    scope: str  # "tenant 'research'"
    unit: Unit
    window: Window
    limit: int
    used: int
    requested: int
    retry_after_ms: int  # until every limit it would pass has reset
    never: bool  # the request alone is over the limit: it can never pass


class _Limit(NamedTuple):
    scope: str
    unit: Unit
    window: Window
    limit: int
    used: int


@dataclass(frozen=True)
class Reading:
    """A request's quotas as the call that queued (or refused) it left them: Redis's time
    and each quota's counts (after the charge when the job was made), and its estimate."""

    now_ms: int
    quotas: tuple[tuple[Quota, Counts], ...]
    tokens: int

    def _limits(self) -> list[_Limit]:
        out = []
        for quota, counts in self.quotas:
            for (unit, window, _), limit, used in zip(_LIMITS, quota.limits(), counts, strict=True):
                if limit is not None:
                    out.append(_Limit(quota.config.scope, unit, window, limit, used))
        return out

    def standing(self, unit: Unit) -> Standing | None:
        """The unit's tightest limit (least left; of two alike, the one that frees later);
        None when no quota limits it."""
        limits = [lim for lim in self._limits() if lim.unit is unit]
        if not limits:
            return None
        tightest = min(limits, key=lambda lim: (lim.limit - lim.used, -lim.window.value))
        return Standing(
            tightest.limit,
            max(0, tightest.limit - tightest.used),
            tightest.window.reset_ms(self.now_ms),
        )

    def refusal(self) -> Refusal | None:
        """The limit this request would pass that frees last, or None if it fits."""
        passed = [lim for lim in self._limits() if lim.used + self._need(lim.unit) > lim.limit]
        if not passed:
            return None
        last = max(passed, key=lambda lim: lim.window.value)
        return Refusal(
            last.scope,
            last.unit,
            last.window,
            last.limit,
            last.used,
            self._need(last.unit),
            last.window.reset_ms(self.now_ms),
            never=any(self._need(lim.unit) > lim.limit for lim in passed),
        )

    def _need(self, unit: Unit) -> int:
        return self.tokens if unit is Unit.TOKENS else 1


def reading(reply: Sequence[Any], quotas: Sequence[Quota], tokens: int) -> Reading:
    """The quota part of enqueue.lua's reply (its time, then four counts per quota)."""
    now = int(reply[0])
    counts = [Counts(*map(int, reply[1 + 4 * i : 5 + 4 * i])) for i in range(len(quotas))]
    return Reading(now, tuple(zip(quotas, counts, strict=True)), tokens)


def refusal_message(refusal: Refusal) -> str:
    """OpenAI's words for it: what was passed, by how much, and when to try again."""
    what = f"{refusal.unit.value} per {refusal.window.per}"
    if refusal.never:
        return (
            f"Request too large for {refusal.scope} on {what}: Limit {refusal.limit}, "
            f"Requested {refusal.requested}. Make the prompt or max_tokens smaller."
        )
    return (
        f"Rate limit reached for {refusal.scope} on {what}: Limit {refusal.limit}, "
        f"Used {refusal.used}, Requested {refusal.requested}. Please try again in "
        f"{math.ceil(refusal.retry_after_ms / 1000)}s."
    )
