"""A mailbox: items on their way from one producer callback to one waiting task.

Every streamed token passes from the result reader to the request that follows its
job. An ``asyncio.Queue`` spends a few microseconds per item on bookkeeping this
path does not use (``join`` counters, a future per ``get``); a mailbox keeps a
list, and its one reader takes everything that arrived since it last looked with
one wake-up, however many items came.
"""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Unbounded, first in first out, for a single reading task at a time."""

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self) -> None:
        self._items: list[T] = []
        self._waiter: asyncio.Future[None] | None = None
        # Looked up once: on Python 3.11 ``get_running_loop`` costs a getpid() system call.
        self._loop: asyncio.AbstractEventLoop | None = None

    def put_nowait(self, item: T) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

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
