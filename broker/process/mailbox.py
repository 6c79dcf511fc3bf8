"""A mailbox: items on their way from one producer callback to one waiting task.

Every streamed token passes from the result reader to the request that follows its
job. An ``asyncio.Queue`` spends a few microseconds per item on bookkeeping this
path does not use (``join`` counters, a future per ``get``); a mailbox keeps a
list, and its one reader takes everything that arrived since it last looked with
one wake-up, however many items came.

A mailbox may also have a ``handler``: a synchronous consumer that is offered an
item while the reading task waits with nothing queued before it. An item the
handler takes never wakes the task (the streamed response writes a token straight
to its client this way, ``gateway.sse``); an item it declines is queued as usual.
Items are never reordered: while anything is queued, or the task is busy with what
it took, the handler is not asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Unbounded, first in first out, for a single reading task at a time."""

    __slots__ = ("_items", "_loop", "_waiter", "handler")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._waiter: asyncio.Future[None] | None = None
        # Looked up once: on Python 3.11 ``get_running_loop`` costs a getpid() system call.
        self._loop: asyncio.AbstractEventLoop | None = None
        # Returns True when it took the item (see the module's docstring).
        self.handler: Callable[[T], bool] | None = None

    def put_nowait(self, item: T) -> None:
        waiter = self._waiter
        if self.handler is not None and self._waiting(waiter) and self.handler(item):
            return  # taken at once: the waiting task stays asleep
        self._items.append(item)
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _waiting(self, waiter: asyncio.Future[None] | None) -> bool:
        """The reading task waits, and nothing is queued before a new item."""
        return waiter is not None and not waiter.done() and not self._items

    def empty(self) -> bool:
        return not self._items

    async def take(self) -> list[T]:
        """Every item that arrived, oldest first: at least one (waits for it)."""
        while not self._items:
            await self._waiter_for_next()  # awaited here: a wake-up crosses no extra frame
        items, self._items = self._items, []
        return items

    async def get(self) -> T:
        """The oldest item (waits for one)."""
        while not self._items:
            await self._waiter_for_next()
        return self._items.pop(0)

    def _waiter_for_next(self) -> asyncio.Future[None]:
        """The future the next ``put_nowait`` completes (cancelling it is harmless)."""
        if self._waiter is not None and not self._waiter.done():
            raise RuntimeError("a mailbox has a single reader: another task waits on it")
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        waiter = self._waiter = self._loop.create_future()
        return waiter
