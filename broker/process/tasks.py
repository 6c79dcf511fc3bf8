"""Stopping background tasks for sure.

A cancel can be swallowed by a library awaited at that moment: redis-py does
so in some connection states (an expiring read timeout turns the cancel into a
``TimeoutError`` that a retry loop then survives). A task that must end is
cancelled again until it does.
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
