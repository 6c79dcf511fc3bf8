"""The process's one reader of result streams: a ``ResultReader`` on a single Redis, one
per hash slot on a cluster (``ClusterResultReader``; see ``broker.redis.cluster``)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from broker import keys
from broker.process.mailbox import Mailbox
from broker.redis.cluster import node_of, slot_of
from broker.redis.resp import RespLink
from broker.results import ResultEvent, ResultReader
from broker.settings import Settings


def result_reader(
    settings: Settings, redis: Redis, block_s: float, link: RespLink | None = None
) -> ResultReader | ClusterResultReader:
    """The process's one reader of result streams; ``redis`` is its shared client
    (``connect``), and ``link`` its shared lean connection (``lean_link``), if any: the
    reader rings its bell stream over the one, else the other."""
    if settings.redis_cluster:
        return ClusterResultReader(settings, redis, block_s)
    return ResultReader(
        RespLink(settings.require_redis_url()),
        redis,
        bell=keys.reader_bell(uuid.uuid4().hex),
        block_ms=int(block_s * 1000),
        ring_link=link,
    )


class ClusterResultReader:
    """``ResultReader``'s interface over a cluster: one reader per slot with followers.

    An XREAD may name streams of one slot only, so each slot that has a followed
    stream gets its own reader and blocking connection, made on first use and
    kept for the process's life (a gateway holds at most one per model).
    """

    def __init__(self, settings: Settings, cluster: Redis, block_s: float) -> None:
        self._url = settings.require_redis_url()
        self._cluster = cluster
        self._block_s = block_s
        self._readers: dict[int, ResultReader] = {}
        self._lock = asyncio.Lock()

    def start(self) -> None:
        """Readers start when their slot is first followed."""

    async def close(self) -> None:
        readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            await reader.close()

    @contextlib.asynccontextmanager
    async def follow(
        self, model: str, job_id: str, after: bytes = b"0-0"
    ) -> AsyncIterator[Mailbox[ResultEvent]]:
        reader = await self._reader(model)
        async with reader.follow(model, job_id, after) as events:
            yield events

    async def events(
        self, model: str, job_id: str, after: bytes = b"0-0"
    ) -> AsyncIterator[ResultEvent]:
        reader = await self._reader(model)
        async for event in reader.events(model, job_id, after):
            yield event

    async def _reader(self, model: str) -> ResultReader:
        slot = slot_of(model)
        reader = self._readers.get(slot)
        if reader is not None:
            return reader
        async with self._lock:  # two first followers of a slot must not make two readers
            if slot not in self._readers:
                self._readers[slot] = await self._open(model)
            return self._readers[slot]

    async def _open(self, model: str) -> ResultReader:
        url = await node_of(self._cluster, model, self._url)
        blocking = RespLink(url)  # the reader bounds each read
        control = Redis.from_url(url, decode_responses=False)  # rings the bell on that node
        bell = keys.reader_bell(uuid.uuid4().hex, model)  # in the slot the reader follows
        reader = _NodeReader(blocking, control, bell, block_ms=int(self._block_s * 1000))
        reader.start()
        return reader


class _NodeReader(ResultReader):
    """A ``ResultReader`` that also closes its control client (made for it alone)."""

    def __init__(self, blocking: RespLink, control: Redis, bell: str, block_ms: int) -> None:
        super().__init__(blocking, control, bell, block_ms=block_ms)
        self._own_control = control

    async def close(self) -> None:
        await super().close()
        await self._own_control.aclose()
