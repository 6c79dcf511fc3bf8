"""A quota's counters, as enqueue.lua stores them, read into what each limit has used, has
left and when it resets (``broker.quotas.counts_now`` and ``uses``,
``broker.quota_status.quota_use``): hand-made counters, no Redis."""

from __future__ import annotations

from broker.quota_status import quota_use
from broker.quotas import COUNTER_FIELDS, DAY_MS, MINUTE_MS, Counts, Quota, Use, counts_now, uses
from broker.settings import QuotaConfig

# 10:00:20 UTC on day 20,000: 40 s left of the minute, 14 h of the day.
DAY = 20_000
NOW_MS = DAY * DAY_MS + 10 * 3_600_000 + 20_000
MINUTE = NOW_MS // MINUTE_MS


def hmget(*values: int | None) -> list[bytes | None]:
    """``HMGET`` of mi, mt, mr, di, dt, dr (``COUNTER_FIELDS``), as redis-py returns it."""
    assert len(values) == len(COUNTER_FIELDS)
    return [None if v is None else str(v).encode() for v in values]


def test_the_windows_of_now_read_their_tokens_and_requests() -> None:
    counters = hmget(MINUTE, 120, 2, DAY, 5_000, 40)
    assert counts_now(counters, NOW_MS) == Counts(120, 5_000, 2, 40)


def test_a_minute_that_has_passed_reads_0_and_its_day_still_counts() -> None:
    counters = hmget(MINUTE - 1, 120, 2, DAY, 5_000, 40)
    assert counts_now(counters, NOW_MS) == Counts(0, 5_000, 0, 40)


def test_a_day_that_has_passed_reads_0_in_both_windows() -> None:
    yesterday = NOW_MS - DAY_MS
    counters = hmget(yesterday // MINUTE_MS, 120, 2, DAY - 1, 5_000, 40)
    assert counts_now(counters, NOW_MS) == Counts(0, 0, 0, 0)


def test_a_quota_never_charged_reads_0() -> None:
    assert counts_now([None] * 6, NOW_MS) == Counts(0, 0, 0, 0)


def test_a_batch_lines_day_without_a_minute_reads_only_the_day() -> None:
    # A batch line charges the day alone (broker.quotas): no 'mi' yet.
    counters = hmget(None, None, None, DAY, 300, 1)
    assert counts_now(counters, NOW_MS) == Counts(0, 300, 0, 1)


def test_each_limit_the_quota_has_reads_used_left_and_its_reset() -> None:
    config = QuotaConfig(tenant="research", tokens_per_minute=200, requests_per_day=50)
    quota = Quota.of(config)
    assert quota.key == "fq:quota:tenant:{research}"
    assert uses(quota, Counts(120, 5_000, 2, 40), NOW_MS) == [
        Use("tokens_per_minute", 120, 200, 40_000),
        Use("requests_per_day", 40, 50, 14 * 3_600_000 - 20_000),
    ]


def test_usage_past_the_limit_leaves_0_not_less() -> None:
    # A job's usage may pass its estimate: settled, the window may pass its limit.
    assert Use("tokens_per_minute", 230, 200, 1_000).remaining == 0
    assert Use("tokens_per_minute", 120, 200, 1_000).remaining == 80


def test_quota_use_names_the_scope_and_gives_the_public_figures() -> None:
    config = QuotaConfig(user="alice", tokens_per_minute=100, tokens_per_day=1_000)
    counters = hmget(MINUTE - 3, 90, 1, DAY, 400, 6)  # the minute passed: 0
    assert quota_use(config, counters, NOW_MS).public() == {
        "scope": "user",
        "name": "alice",
        "limits": [
            {"name": "tokens_per_minute", "used": 0, "limit": 100, "remaining": 100,
             "reset_s": 40.0},
            {"name": "tokens_per_day", "used": 400, "limit": 1_000, "remaining": 600,
             "reset_s": 14 * 3_600 - 20.0},
        ],
    }  # fmt: skip
