"""The mailbox between the result reader and a request (broker.process.mailbox): pure, no I/O."""

from __future__ import annotations

import asyncio

import pytest

from broker.process.mailbox import Mailbox


async def test_take_returns_everything_that_arrived_oldest_first() -> None:
    box: Mailbox[int] = Mailbox()
    for item in (1, 2, 3):
        box.put_nowait(item)
    assert not box.empty()
    assert await box.take() == [1, 2, 3]
    assert box.empty()


async def test_a_waiting_take_wakes_at_the_first_item() -> None:
    box: Mailbox[str] = Mailbox()
    taking = asyncio.create_task(box.take())
    await asyncio.sleep(0)
    assert not taking.done()  # nothing came yet
    box.put_nowait("a")
    box.put_nowait("b")  # before the task runs: it takes both at once
    assert await taking == ["a", "b"]


async def test_get_returns_one_item_at_a_time() -> None:
    box: Mailbox[int] = Mailbox()
    getting = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    box.put_nowait(7)
    box.put_nowait(8)
    assert await getting == 7
    assert await box.get() == 8


async def test_a_cancelled_wait_leaves_the_mailbox_usable() -> None:
    box: Mailbox[int] = Mailbox()
    taking = asyncio.create_task(box.take())
    await asyncio.sleep(0)
    taking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taking
    box.put_nowait(1)  # no waiter left to wake: kept for the next reader
    assert await box.take() == [1]


async def test_a_second_reader_waiting_at_once_is_refused() -> None:
    box: Mailbox[int] = Mailbox()
    first = asyncio.create_task(box.take())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="single reader"):
        await box.take()
    box.put_nowait(1)
    assert await first == [1]


async def test_a_handler_takes_items_only_while_the_reader_waits_with_nothing_queued() -> None:
    box: Mailbox[int] = Mailbox()
    handled: list[int] = []
    box.handler = lambda item: handled.append(item) is None  # takes everything offered
    box.put_nowait(1)  # nobody waits: queued
    assert handled == [] and await box.take() == [1]
    taking = asyncio.create_task(box.take())
    await asyncio.sleep(0)
    box.put_nowait(2)
    box.put_nowait(3)
    await asyncio.sleep(0)
    assert handled == [2, 3]
    assert not taking.done()  # the handler took them: the reader was never woken
    box.handler = None
    box.put_nowait(4)
    assert await taking == [4]


async def test_a_declined_item_wakes_the_reader_and_nothing_overtakes_it() -> None:
    box: Mailbox[str] = Mailbox()
    offered: list[str] = []

    def handler(item: str) -> bool:
        offered.append(item)
        return item != "slow"  # declines one: the client must catch up first

    box.handler = handler
    taking = asyncio.create_task(box.take())
    await asyncio.sleep(0)
    box.put_nowait("slow")
    box.put_nowait("next")  # the reader is woken but has not run: queued behind "slow"
    assert await taking == ["slow", "next"]
    assert offered == ["slow"]
    box.put_nowait("while busy")  # the reader is not waiting: queued, not offered
    assert offered == ["slow"] and await box.take() == ["while busy"]
