"""Redis Cluster mode (``redis_cluster: true``): what differs from a single Redis.

Every key of a model carries the model as its hash tag (``broker.keys``), so all
of one model's keys live in one slot, and each Lua script, pipeline entry and
blocking read names keys of one model only. Three things cannot be one command
against a cluster and are split here, per slot:

* a worker's ``XREADGROUP`` over several models' ready streams: ``slot_groups``
  makes one group of models per slot; the worker runs one claim lane per group,
  each on a plain connection to the master serving its slot (``SlotConnections``;
  a single Redis: one lane over all models, as before);
* the gateway's multiplexed ``XREAD`` over the result streams it follows:
  ``ClusterResultReader`` runs one ``ResultReader`` per slot, on a plain
  connection to the master serving that slot, with its bell stream in that slot
  (tagged with a model the reader follows);
* Lua scripts queued in a pipeline by SHA: redis-py refuses ``evalsha`` in a
  cluster pipeline, as it cannot load scripts there. ``_ScriptingPipeline``
  allows it; dispatchers and workers load every script on every master at start
  (``load_scripts``), and a ``NOSCRIPT`` (a restarted master) reloads them all
  before it is raised to the caller, whose retry (result writer, lease loops)
  then succeeds.

Pub/sub needs nothing: a script's ``PUBLISH`` is broadcast over the cluster bus,
so a subscriber on any one node (redis-py's ``ClusterPubSub``) hears every model.

A slot moved to another master (resharding, failover) while a gateway runs is
found by the cluster client for commands, not by a per-slot reader already
connected: restart gateways after resharding (docs/operations.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Sequence
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisClusterException

from broker import keys
from broker.lua import load_scripts
from broker.redis.options import CLIENT_OPTIONS, plain_blocking
from broker.settings import Settings


class _StreamRouted(RedisCluster):
    """Routes XREAD and XREADGROUP by their stream keys without asking a node.

    redis-py finds the keys of a command with movable keys by sending ``COMMAND
    GETKEYS`` to a node first: a round trip more per read, and concurrent reads
    raced on that connection (seen with redis-py 8.1).
    """

    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() not in ("XREAD", "XREADGROUP") or b"STREAMS" not in args:
            return await super()._determine_slot(command, *args)
        rest = args[args.index(b"STREAMS") + 1 :]
        slots = {self.keyslot(key) for key in rest[: len(rest) // 2]}
        if len(slots) != 1:
            raise RedisClusterException(f"{command} - all keys must map to the same key slot")
        return slots.pop()


class _BoundedCluster(_StreamRouted):
    """A cluster client whose commands wait for a free permit instead of failing.

    redis-py's cluster node pool raises ``MaxConnectionsError`` when all its
    connections are busy; the single-Redis client's blocking pool waits instead,
    which a burst of requests at a gateway needs. At most ``redis_max_connections``
    commands run at once, so no node's pool (as large) is ever exhausted.
    """

    def __init__(self, *args: Any, permits: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._permits = asyncio.Semaphore(permits)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self._permits:
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if transaction or shard_hint:  # MULTI needs one slot: redis-py checks it
            return super().pipeline(transaction, shard_hint)
        # redis-py's CommandsProtocol declares _event_dispatcher, which ClusterPipeline never
        # sets (it does not use it), so mypy takes every ClusterPipeline for abstract.
        return _ScriptingPipeline(self)  # type: ignore[abstract]


class _ScriptingPipeline(ClusterPipeline):
    """A cluster pipeline that may call scripts by SHA.

    redis-py refuses ``evalsha`` in cluster pipelines because it cannot load the
    scripts there. The command itself routes by its keys like any other, and each
    of fairq's scripts names keys of one model; what is missing is the load, so a
    ``NOSCRIPT`` (a fresh or restarted master) loads every fairq script on every
    master before it is raised, and the caller's retry finds them.
    """

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> _Queued:
        self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)
        return _Queued(self)

    @property
    def command_stack(self) -> list[Any]:
        """The commands queued so far, under the name a single-Redis pipeline gives them."""
        return self._execution_strategy._command_queue  # type: ignore[attr-defined,no-any-return]

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        try:
            return await super().execute(raise_on_error, allow_redirections)
        except NoScriptError:
            await load_scripts(self.cluster_client)
            raise


class _Queued:
    """What ``evalsha`` on a cluster pipeline returns: redis-py's ``Script`` awaits it,
    and awaiting the pipeline itself would empty its queue (it re-initializes)."""

    def __init__(self, pipe: ClusterPipeline) -> None:
        self._pipe = pipe

    def __await__(self) -> Generator[Any, None, ClusterPipeline]:
        return self._queued().__await__()

    async def _queued(self) -> ClusterPipeline:
        return self._pipe


def connect_cluster(settings: Settings, options: dict[str, Any] | None = None) -> Redis:
    """An asyncio cluster client with bytes replies; it answers the commands fairq uses
    as a ``Redis`` does (typed as one so that callers need not care). ``options``: the
    client options (``options.CLIENT_OPTIONS`` unless given)."""
    client = _BoundedCluster.from_url(
        settings.require_redis_url(),
        permits=settings.redis_max_connections,
        max_connections=settings.redis_max_connections,
        **(CLIENT_OPTIONS if options is None else options),
    )
    return cast(Redis, client)


def slot_of(model: str) -> int:
    """The hash slot holding every key of ``model``."""
    return key_slot(keys.ready(model).encode())


def slot_groups(models: Sequence[str], cluster: bool) -> list[list[str]]:
    """Models whose keys may be named in one command: all of them on a single Redis,
    else one group per hash slot (in the order the models are given)."""
    if not cluster or len(models) <= 1:
        return [list(models)] if models else []
    groups: dict[int, list[str]] = {}
    for model in models:
        groups.setdefault(slot_of(model), []).append(model)
    return list(groups.values())


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (its scheme, credentials and options) pointed at another node."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def node_of(cluster: Redis, model: str, url: str) -> str:
    """The URL of the master that serves ``model``'s slot now."""
    client = cast(RedisCluster, cluster)
    await client.initialize()  # the slot map (made on the first command otherwise)
    node = client.get_node_from_key(keys.ready(model))
    assert node is not None  # None only for a replica; a slot without a master raises
    return node_url(url, node.host, int(node.port))


class SlotConnections:
    """Plain blocking connections, one per group of models of one slot, each to the
    master serving that slot: a worker's claim lanes read through these.

    Plain connections, not the cluster client's pools: concurrent blocking reads
    through one cluster client raced on its connection set-up (redis-py 8.1).
    """

    def __init__(self, settings: Settings, cluster: Redis, block_s: float) -> None:
        self._url = settings.require_redis_url()
        self._cluster = cluster
        self._block_s = block_s
        self._open: dict[int, Redis] = {}

    async def get(self, models: Sequence[str]) -> Redis:
        """The connection for ``models`` (all of one slot); made on first use."""
        slot = slot_of(models[0])
        if slot not in self._open:
            url = await node_of(self._cluster, models[0], self._url)
            self._open[slot] = plain_blocking(url, self._block_s)
        return self._open[slot]

    async def reset(self, models: Sequence[str]) -> None:
        """Forget the connection after an error: the slot may have moved to another master."""
        connection = self._open.pop(slot_of(models[0]), None)
        if connection is not None:
            await connection.aclose()

    async def aclose(self) -> None:
        connections, self._open = list(self._open.values()), {}
        for connection in connections:
            await connection.aclose()
