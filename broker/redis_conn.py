"""Creating Redis clients from the settings (the URL carries AUTH and TLS: rediss://).

With ``redis_cluster`` the same functions return cluster clients (``broker.cluster``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from redis.asyncio import BlockingConnectionPool, Redis

from broker import keys
from broker.results import ResultReader
from broker.settings import Settings

if TYPE_CHECKING:
    from broker.cluster import ClusterResultReader


# Every fairq client, single server or cluster: bytes replies (the hot path decodes what
# it needs), dead connections found within 30 s, TCP keepalive.
CLIENT_OPTIONS: dict[str, Any] = {
    "decode_responses": False,
    "health_check_interval": 30,
    "socket_keepalive": True,
}


def connect(settings: Settings) -> Redis:
    """An asyncio Redis client with bytes replies; connects lazily on first use.

    Its pool blocks when all ``redis_max_connections`` are busy: redis-py's default
    pool instead fails the 101st concurrent command, which a burst of requests at a
    gateway reaches at once.
    """
    if settings.redis_cluster:
        from broker.cluster import connect_cluster

        return connect_cluster(settings)
    pool = BlockingConnectionPool.from_url(
        settings.require_redis_url(),
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s,
        **CLIENT_OPTIONS,
    )
    return Redis.from_pool(pool)  # the client owns the pool and closes it


def connect_blocking(settings: Settings, block_s: float) -> Redis:
    """A one-connection client for a long blocking read loop (see ``plain_blocking``).

    On a cluster it connects to the node the URL names; blocking reads of models
    elsewhere go through ``broker.cluster.SlotConnections``.
    """
    return plain_blocking(settings.require_redis_url(), block_s)


def plain_blocking(url: str, block_s: float) -> Redis:
    """A one-connection client for a long blocking read loop.

    It never retries on its own (the loop reconnects with backoff and must learn
    its new CLIENT ID), and its socket timeout outlasts the longest block.
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(  # type: ignore[no-any-return]
        url,
        decode_responses=False,
        single_connection_client=True,
        socket_timeout=block_s + 5.0,
        retry=Retry(NoBackoff(), 0),
    )


def result_reader(
    settings: Settings, redis: Redis, block_s: float
) -> ResultReader | ClusterResultReader:
    """The process's one reader of result streams; ``redis`` is its shared client
    (``connect``), used to ring the reader's bell stream."""
    if settings.redis_cluster:
        from broker.cluster import ClusterResultReader

        return ClusterResultReader(settings, redis, block_s)
    return ResultReader(
        plain_blocking(settings.require_redis_url(), block_s),
        redis,
        bell=keys.reader_bell(uuid.uuid4().hex),
        block_ms=int(block_s * 1000),
    )
