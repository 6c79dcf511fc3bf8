"""What each configured quota has used now: the ``quotas`` of ``/admin/status`` (and so of
``fairq status`` and the dashboard) and the dispatcher's ``fairq_quota_*`` gauges.

One pipelined round trip for all quotas, whatever their number: Redis's ``TIME`` (the
clock enqueue.lua numbers the windows by, not this host's) and one ``HMGET`` of each
quota's counters (``broker.quotas.COUNTER_FIELDS``). The read takes no lock and changes
nothing: a job queued meanwhile shows at the next read. Only the configured quotas are
read, so the series and rows are bounded by the configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from broker.quotas import COUNTER_FIELDS, Quota, QuotaLimits, Use, counts_now, uses


@dataclass(frozen=True)
class QuotaUse:
    """One tenant's or user's quota now."""

    scope: str  # "tenant" | "user"
    name: str
    uses: tuple[Use, ...]

    def public(self) -> dict[str, object]:
        return {
            "scope": self.scope,
            "name": self.name,
            "limits": [
                {
                    "name": use.name,
                    "used": use.used,
                    "limit": use.limit,
                    "remaining": use.remaining,
                    "reset_s": use.reset_ms / 1000,
                }
                for use in self.uses
            ],
        }


def quota_use(config: QuotaLimits, counters: Sequence[bytes | None], now_ms: int) -> QuotaUse:
    """A quota's entry and its counters' ``HMGET`` reply, read at ``now_ms``."""
    scope, name = ("tenant", config.tenant) if config.tenant is not None else ("user", config.user)
    used = uses(Quota.of(config), counts_now(counters, now_ms), now_ms)
    return QuotaUse(scope, str(name), tuple(used))


async def read_quotas(redis: Redis, quotas: Sequence[QuotaLimits]) -> list[QuotaUse]:
    """Every quota of the settings, in their order, as its counters stand now."""
    if not quotas:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        pipe.time()
        for config in quotas:
            pipe.hmget(Quota.of(config).key, COUNTER_FIELDS)
        (seconds, micros), *counters = await pipe.execute()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    return [quota_use(c, h, now_ms) for c, h in zip(quotas, counters, strict=True)]
