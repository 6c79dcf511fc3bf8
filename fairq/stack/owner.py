"""Whose private Redis a URL names: a ``fairq up``'s private Redis is that stack's alone.

The stack that starts a private Redis writes into it who it is (``keys.LOCAL_STACK``:
its pid, its gateway, its configuration file; ``claim``). A second ``fairq up`` about to
run on a Redis reads that first (``owner_of``) and refuses when another stack owns it:
a shell that still holds the first stack's export lines (``FAIRQ_REDIS_URL``) would
otherwise put a second set of components, with other engines, on the first's queues,
silently (the second's batches failed with "model does not exist", the first's
newcomers waited behind the second's flood). Joining on purpose is not offered either:
the private Redis dies with its stack, and the second stack's jobs with it. A Redis the
user runs (``--redis-url``) carries no claim, and any number of stacks may share it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker import keys

_TIMEOUT_S = 1.0  # a Redis that does not answer at once is nobody's private one


@dataclass(frozen=True)
class StackOwner:
    """The ``fairq up`` whose private Redis it is."""

    pid: int
    gateway_url: str
    config: str  # the configuration file its children read (its FAIRQ_CONFIG export)


def claim(url: str, owner: StackOwner) -> None:
    """Write ``owner`` into the Redis at ``url`` (the stack's private one, just started)."""
    with _client(url) as client:
        client.set(keys.LOCAL_STACK, json.dumps(asdict(owner)))


def owner_of(url: str) -> StackOwner | None:
    """The stack whose private Redis ``url`` names; None for any other Redis, and for one
    that does not answer (the components then say so themselves)."""
    try:
        with _client(url) as client:
            raw = client.get(keys.LOCAL_STACK)
        found = None if raw is None else json.loads(raw)
        return None if found is None else StackOwner(**found)
    except (redis.RedisError, ValueError, TypeError):
        return None


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=_TIMEOUT_S,
        socket_timeout=_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),  # one try: redis-py's retries took seconds to say no
    )
