"""The scaler's feed: each model's demand read from Redis as soon as it may have changed.

Two sources, one loop. The enqueue, complete, cancel and expire scripts publish on the
model's wake channel (``keys.wake_channel``); the listener marks that model for a read
and wakes the loop, so a model's first job is read (and pushed to KEDA) within
milliseconds of its enqueue, not at the next poll. Pub/sub delivers at most once, so
every ``poll_s`` all models are read anyway, and after a lost subscription too.

Reads are two pipelined HGETALLs per model (the queued and in-flight counters,
``scaler.target.demand_of``), at most one read in flight and at least
``min_gap_s`` (50 ms) between two: under a flood of enqueues the loop reads at most
twenty times a second, whatever the rate of wake messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import keys
from broker.process.backoff import Backoff
from scaler.board import DemandBoard
from scaler.target import demand_of

log = logging.getLogger(__name__)


async def read_demand(redis: Redis, models: Collection[str]) -> dict[str, int]:
    """Each model's demand now (one pipelined round trip)."""
    async with redis.pipeline(transaction=False) as pipe:
        for model in models:
            pipe.hgetall(keys.queued_counts(model))
            pipe.hgetall(keys.inflight(model))
        replies = iter(await pipe.execute())
    return {model: demand_of(next(replies), next(replies)) for model in models}


class DemandWatch:
    def __init__(
        self, redis: Redis, board: DemandBoard, poll_s: float, min_gap_s: float = 0.05
    ) -> None:
        self._redis = redis
        self._board = board
        self._poll_s = poll_s
        self._min_gap_s = min_gap_s
        self._dirty: set[str] = set(board.models)
        self._woken = asyncio.Event()
        self._channels = {keys.wake_channel(m).encode(): m for m in board.models}

    async def run(self, stop: asyncio.Event) -> None:
        """Read and publish into the board until ``stop``."""
        listener = asyncio.create_task(self._listen_forever())
        try:
            await self._refresh_until(stop)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _refresh_until(self, stop: asyncio.Event) -> None:
        backoff = Backoff()
        last = 0.0
        next_poll = time.monotonic()
        while not stop.is_set():
            await self._wait(stop, next_poll - time.monotonic())
            now = time.monotonic()
            if now >= next_poll:
                self._dirty = set(self._board.models)
                next_poll = now + self._poll_s
            await asyncio.sleep(max(0.0, last + self._min_gap_s - now))
            self._woken.clear()
            models, self._dirty = self._dirty, set()
            if not models:
                continue
            last = time.monotonic()
            try:
                demand = await read_demand(self._redis, models)
            except RedisError as exc:
                log.warning("demand not read (%s); retrying in %.2f s", exc, backoff.delay_s)
                self._dirty |= models
                await backoff.wait()
                continue
            backoff.reset()
            for model in self._board.update(demand, complete=len(models) == len(self._channels)):
                log.info("model %s is %s", model, "active" if demand[model] else "idle")

    async def _wait(self, stop: asyncio.Event, timeout_s: float) -> None:
        if self._woken.is_set() or timeout_s <= 0:
            return
        waits = [asyncio.ensure_future(e.wait()) for e in (self._woken, stop)]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()

    def _mark(self, models: Collection[str]) -> None:
        self._dirty.update(models)
        self._woken.set()

    async def _listen_forever(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self._listen(backoff)
            except RedisError as exc:
                log.warning("wake subscription lost (%s); resubscribing", exc)
                self._mark(self._board.models)  # what changed meanwhile is unknown
                await backoff.wait()

    async def _listen(self, backoff: Backoff) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(*self._channels)
            backoff.reset()
            async for message in pubsub.listen():
                model = self._channels.get(message["channel"])
                if model is not None:
                    self._mark((model,))
        finally:
            await pubsub.aclose()
