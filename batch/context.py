"""What one batch step (an RQ job) works with, and the lease that makes it the only one.

A batch is advanced by one RQ job at a time: the batch worker's sweep takes the
batch's lease (``SET NX PX``, ``batch.lease_s``) and enqueues a step that
carries the lease's token. The step renews the lease between chunks of work and
releases it when done; a step that finds the lease gone or another token stops
(``LeaseLost``). A batch worker killed mid-step holds the lease no longer than
``lease_s``: the next sweep gives the batch to a new step, which resumes from
what Redis holds. Every step is idempotent, so work redone after a kill changes
nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.asyncio import Redis

from broker.batch.errors import LeaseLost
from broker.batch.files import FileStore
from broker.batch.store import BatchStore
from broker.queue import JobQueue
from broker.settings import Settings


@dataclass
class StepContext:
    redis: Redis
    settings: Settings
    batch_id: str
    token: str
    store: BatchStore = field(init=False)
    files: FileStore = field(init=False)
    queue: JobQueue = field(init=False)

    def __post_init__(self) -> None:
        self.store = BatchStore(self.redis)
        self.queue = JobQueue(self.redis, self.settings)
        self.files = FileStore(self.redis, self.settings.batch.read_block_bytes)

    async def renew(self) -> None:
        """Extend the lease; LeaseLost if this step no longer holds it."""
        ms = self.settings.batch.lease_s * 1000
        if not await self.store.hold_lease(self.batch_id, self.token, ms):
            raise LeaseLost(f"batch {self.batch_id}: another step holds the batch")

    async def release(self) -> None:
        await self.store.hold_lease(self.batch_id, self.token, 0)
