"""OpenAI's rate-limit headers from a request's quotas (``gateway.ratelimit``): their
values, a 429's Retry-After, and the reset times written as OpenAI's are."""

from __future__ import annotations

import pytest

from broker import OverQuota, keys
from broker.quotas import Counts, Quota, Reading
from broker.settings import QuotaConfig
from gateway.errors import error_response
from gateway.ratelimit import duration, ratelimit_headers

NOW = 1748736000000 + 30_250  # 30.25 s into a UTC minute (and day)
LAB = Quota(keys.tenant_quota("lab"), QuotaConfig(tenant="lab", tokens_per_minute=1000))
BOTH = Quota(
    keys.user_quota("ann"), QuotaConfig(user="ann", tokens_per_day=9000, requests_per_minute=60)
)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0ms"),
        (20, "20ms"),
        (999, "999ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (17_535, "17.535s"),
        (60_000, "1m0s"),
        (360_000, "6m0s"),
        (90_250, "1m30.25s"),
        (7_384_250, "2h3m4.25s"),
        (86_400_000, "24h0m0s"),
    ],
)
def test_a_reset_time_is_written_as_openais_are(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_each_limited_unit_gets_its_limit_remaining_and_reset() -> None:
    quota = Reading(NOW, ((LAB, Counts(250, 250, 1, 1)), (BOTH, Counts(250, 8900, 4, 4))), 25)
    assert ratelimit_headers(quota) == {
        "x-ratelimit-limit-tokens": "9000",  # ann's day leaves 100, the lab's minute 750
        "x-ratelimit-remaining-tokens": "100",
        "x-ratelimit-reset-tokens": "23h59m29.75s",
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "56",
        "x-ratelimit-reset-requests": "29.75s",
    }
    tokens_only = Reading(NOW, ((LAB, Counts(0, 0, 0, 0)),), 1)
    assert set(ratelimit_headers(tokens_only)) == {
        "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"
    }  # fmt: skip


def test_a_429_says_when_to_try_again_and_one_that_never_fits_not_to() -> None:
    quota = Reading(NOW, ((LAB, Counts(990, 990, 9, 9)),), 25)
    later = OverQuota("over", unit="tokens", quota=quota, retry_after_ms=29_750, never=False)
    response = error_response(later)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "30" and response.headers["retry-after-ms"] == "29750"
    assert response.headers["x-ratelimit-remaining-tokens"] == "10"
    assert "x-should-retry" not in response.headers
    assert b'"type":"tokens"' in response.body and b'"code":"rate_limit_exceeded"' in response.body
    never = OverQuota("too large", unit="tokens", quota=quota, retry_after_ms=29_750, never=True)
    assert error_response(never).headers["x-should-retry"] == "false"
