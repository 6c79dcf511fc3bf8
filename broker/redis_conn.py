"""Creating Redis clients from the settings (the URL carries AUTH and TLS: rediss://)."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis

from broker.settings import Settings


def connect(settings: Settings) -> Redis:
    """An asyncio Redis client with bytes replies; connects lazily on first use.

    Its pool blocks when all ``redis_max_connections`` are busy: redis-py's default
    pool instead fails the 101st concurrent command, which a burst of requests at a
    gateway reaches at once.
    """
    pool = BlockingConnectionPool.from_url(
        settings.require_redis_url(),
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s,
        decode_responses=False,
        health_check_interval=30,
        socket_keepalive=True,
    )
    return Redis.from_pool(pool)  # the client owns the pool and closes it


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
