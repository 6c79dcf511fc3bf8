"""``wait_event``: a timed wait that reports whether the event came, and lets a cancel
through even when it comes as the event is set (Python 3.11's ``wait_for`` returns then)."""

from __future__ import annotations

import asyncio

import pytest

from broker import wait_event


def test_it_says_whether_the_event_came() -> None:
    async def run() -> tuple[bool, bool]:
        event = asyncio.Event()
        missed = await wait_event(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        return missed, await wait_event(event, 10)

    assert asyncio.run(run()) == (False, True)


def test_a_cancel_that_comes_as_the_event_is_set_is_not_swallowed() -> None:
    async def run() -> None:
        event = asyncio.Event()
        waiting = asyncio.create_task(wait_event(event, 10))
        await asyncio.sleep(0)  # it waits now
        event.set()
        waiting.cancel()  # before it could see the event
        await waiting

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run())
