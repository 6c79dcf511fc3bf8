"""Creating Redis clients from the settings (the URL carries AUTH and TLS: rediss://).

With ``redis_cluster`` the same functions return cluster clients (``broker.cluster``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from redis.asyncio import BlockingConnectionPool, Redis

from broker import keys
from broker.resp import RespLink, keepalive_options
from broker.results import READ_MARGIN_S, ResultReader
from broker.settings import Settings

if TYPE_CHECKING:
    from broker.cluster import ClusterResultReader


# Every fairq client, single server or cluster: bytes replies (the hot path decodes what
# it needs), idle connections checked every 30 s, and no per-command socket time-out.
# redis-py 8 bounds each command by 5 s by default, which costs a task and a timer per
# command (~40 µs of CPU on this project's test machine, more than the command itself);
# a dead Redis host is found by the keepalive options instead, and the hot paths that
# wait on Redis bound their own round trips (``broker.packed``, ``broker.results``).
CLIENT_OPTIONS: dict[str, Any] = {
    "decode_responses": False,
    "health_check_interval": 30,
    "socket_timeout": None,
    "socket_connect_timeout": 5.0,
    "socket_keepalive": True,
    "socket_keepalive_options": keepalive_options(),
}


def connect(settings: Settings, command_timeout_s: float | None = None) -> Redis:
    """An asyncio Redis client with bytes replies; connects lazily on first use.

    Its pool blocks when all ``redis_max_connections`` are busy: redis-py's default
    pool instead fails the 101st concurrent command, which a burst of requests at a
    gateway reaches at once. ``command_timeout_s`` bounds each command (a redis-py
    ``TimeoutError`` past it); None leaves them unbounded, as ``CLIENT_OPTIONS`` says why.
    """
    options = {**CLIENT_OPTIONS, "socket_timeout": command_timeout_s}
    if settings.redis_cluster:
        from broker.cluster import connect_cluster

        return connect_cluster(settings, options)
    pool = BlockingConnectionPool.from_url(
        settings.require_redis_url(),
        max_connections=settings.redis_max_connections,
        timeout=settings.redis_pool_timeout_s,
        **options,
    )
    return Redis.from_pool(pool)  # the client owns the pool and closes it


def lean_link(settings: Settings) -> RespLink | None:
    """The process's lean connection (``broker.resp``) for the calls made per token or per
    request: the result writer's flushes, ``enqueue.lua``, ``start.lua``. None on a
    cluster, whose client routes each command by slot (redis-py's stays in use there)."""
    return None if settings.redis_cluster else RespLink(settings.require_redis_url())


def connect_blocking(settings: Settings, block_s: float) -> Redis:
    """A one-connection client for a long blocking read loop (see ``plain_blocking``).

    On a cluster it connects to the node the URL names; blocking reads of models
    elsewhere go through ``broker.cluster.SlotConnections``.
    """
    return plain_blocking(settings.require_redis_url(), block_s)


def plain_blocking(url: str, block_s: float) -> Redis:
    """A one-connection client for a long blocking read loop, with ``CLIENT_OPTIONS``.

    It never retries on its own (the loop reconnects with backoff and must learn
    its new CLIENT ID). Its socket timeout outlasts the longest block (``block_s``)
    by ``READ_MARGIN_S``. (The result reader, which reads most often, has a lean
    connection of its own instead: ``broker.resp``.)
    """
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Redis.from_url(
        url,
        single_connection_client=True,
        retry=Retry(NoBackoff(), 0),
        **{**CLIENT_OPTIONS, "socket_timeout": block_s + READ_MARGIN_S},
    )


def result_reader(
    settings: Settings, redis: Redis, block_s: float, link: RespLink | None = None
) -> ResultReader | ClusterResultReader:
    """The process's one reader of result streams; ``redis`` is its shared client
    (``connect``), and ``link`` its shared lean connection (``lean_link``), if any: the
    reader rings its bell stream over the one, else the other."""
    if settings.redis_cluster:
        from broker.cluster import ClusterResultReader

        return ClusterResultReader(settings, redis, block_s)
    return ResultReader(
        RespLink(settings.require_redis_url()),
        redis,
        bell=keys.reader_bell(uuid.uuid4().hex),
        block_ms=int(block_s * 1000),
        ring_link=link,
    )
