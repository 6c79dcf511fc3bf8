"""Stopping background tasks for sure, and waiting for an event without losing a cancel.

A cancel can be swallowed by a library awaited at that moment: redis-py does
so in some connection states (an expiring read timeout turns the cancel into a
``TimeoutError`` that a retry loop then survives). A task that must end is
cancelled again until it does.

Python 3.11's ``asyncio.wait_for`` swallows one too: a cancel that comes as the awaited
event is set returns the result instead. Timed waits use ``asyncio.timeout``
(``wait_event``), which lets the cancel through.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Task[Any], retry_s: float = 0.5) -> None:
    """Cancel ``task`` and wait for its end, cancelling again every ``retry_s``."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=retry_s)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passed; whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, timeout_s)):
            await event.wait()
    return event.is_set()
