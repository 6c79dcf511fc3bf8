"""Creating Redis clients from the settings (the URL carries AUTH and TLS: rediss://)."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.settings import Settings


def connect(settings: Settings, **options: object) -> Redis:
    """An asyncio Redis client with bytes replies; connects lazily on first use."""
    return Redis.from_url(  # type: ignore[no-any-return]
        settings.require_redis_url(),
        decode_responses=False,
        health_check_interval=30,
        socket_keepalive=True,
        **options,
    )


def connect_blocking(settings: Settings, block_s: float) -> Redis:
    """A one-connection client for a long blocking read loop.

    It never retries on its own (the loop reconnects with backoff and must learn
    its new CLIENT ID), and its socket timeout outlasts the longest block.
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(  # type: ignore[no-any-return]
        settings.require_redis_url(),
        decode_responses=False,
        single_connection_client=True,
        socket_timeout=block_s + 5.0,
        retry=Retry(NoBackoff(), 0),
    )
