"""The options every fairq Redis client shares, and the plain client of a blocking loop."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from broker.redis.resp import keepalive_options

# A read that blocks for ``block_ms`` may take this much longer before it counts as lost.
READ_MARGIN_S = 5.0

# Every fairq client, single server or cluster: bytes replies (the hot path decodes what
# it needs), idle connections checked every 30 s, and no per-command socket time-out.
# redis-py 8 bounds each command by 5 s by default, which costs a task and a timer per
# command (more CPU than the command itself);
# a dead Redis host is found by the keepalive options instead, and the hot paths that
# wait on Redis bound their own round trips (``broker.redis.packed``, ``broker.results``).
CLIENT_OPTIONS: dict[str, Any] = {
    "decode_responses": False,
    "health_check_interval": 30,
    "socket_timeout": None,
    "socket_connect_timeout": 5.0,
    "socket_keepalive": True,
    "socket_keepalive_options": keepalive_options(),
}


def plain_blocking(url: str, block_s: float) -> Redis:
    """A one-connection client for a long blocking read loop, with ``CLIENT_OPTIONS``.

    It never retries on its own (the loop reconnects with backoff and must learn
    its new CLIENT ID). Its socket timeout outlasts the longest block (``block_s``)
    by ``READ_MARGIN_S``. (The result reader, which reads most often, has a lean
    connection of its own instead: ``broker.redis.resp``.)
    """
    return Redis.from_url(
        url,
        single_connection_client=True,
        retry=Retry(NoBackoff(), 0),
        **{**CLIENT_OPTIONS, "socket_timeout": block_s + READ_MARGIN_S},
    )
