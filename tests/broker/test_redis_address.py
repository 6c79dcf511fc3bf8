"""``Settings.redis_address``: where Redis is, for the operator's log, never its password."""

from __future__ import annotations

import pytest

from broker.settings import Settings


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@10.0.0.5:6380/2", "redis://10.0.0.5:6380/2"),
        ("rediss://fairq:s3cret@redis.example.internal/0", "rediss://redis.example.internal/0"),
        ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock"),
    ],
)
def test_the_address_keeps_where_and_drops_the_credentials(url: str, shown: str) -> None:
    assert Settings(redis_url=url).redis_address() == shown
    assert "s3cret" not in Settings(redis_url=url).redis_address()


def test_no_url_is_said() -> None:
    assert Settings(redis_url=None).redis_address() == "unset"
