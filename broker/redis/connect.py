"""Creating Redis clients from the settings (the URL carries AUTH and TLS: rediss://).

With ``redis_cluster`` the same functions return cluster clients (``broker.redis.cluster``).
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis

from broker.redis.cluster import connect_cluster
from broker.redis.options import CLIENT_OPTIONS, plain_blocking
from broker.redis.resp import RespLink
from broker.settings import Settings


def connect(settings: Settings, command_timeout_s: float | None = None) -> Redis:
    """An asyncio Redis client with bytes replies; connects lazily on first use.

    Its pool blocks when all ``redis_max_connections`` are busy: redis-py's default
    pool instead fails the 101st concurrent command, which a burst of requests at a
    gateway reaches at once. ``command_timeout_s`` bounds each command (a redis-py
    ``TimeoutError`` past it); None leaves them unbounded, as ``CLIENT_OPTIONS`` says why.
    """
    options = {**CLIENT_OPTIONS, "socket_timeout": command_timeout_s}
    if settings.redis_cluster:
        return connect_cluster(settings, options)
    pool = BlockingConnectionPool.from_url(
        settings.require_redis_url(),
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s,
        **options,
    )
    return Redis.from_pool(pool)  # the client owns the pool and closes it


def lean_link(settings: Settings) -> RespLink | None:
    """The process's lean connection (``broker.redis.resp``) for the calls made per token or per
    request: the result writer's flushes, ``enqueue.lua``, ``start.lua``. None on a
    cluster, whose client routes each command by slot (redis-py's stays in use there)."""
    return None if settings.redis_cluster else RespLink(settings.require_redis_url())


def connect_blocking(settings: Settings, block_s: float) -> Redis:
    """A one-connection client for a long blocking read loop (see ``plain_blocking``).

    On a cluster it connects to the node the URL names; blocking reads of models
    elsewhere go through ``broker.redis.cluster.SlotConnections``.
    """
    return plain_blocking(settings.require_redis_url(), block_s)
