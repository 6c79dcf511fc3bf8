"""Waiting between the retries of a loop whose Redis or engine call failed.

Exponential: the first retry waits 50 ms and each failure in a row doubles the wait, up
to 2 s, so a short blip costs a request little and a Redis that is down is not hammered;
a success starts over from 50 ms.
"""

from __future__ import annotations

import asyncio

FIRST_S = 0.05
LONGEST_S = 2.0


class Backoff:
    """The wait before the next retry of one loop."""

    def __init__(self, first_s: float = FIRST_S, longest_s: float = LONGEST_S) -> None:
        self._first_s = first_s
        self._longest_s = longest_s
        self.delay_s = first_s  # the next wait, for the log line that announces it

    async def wait(self) -> None:
        """Sleep the current delay, then double it (up to the longest)."""
        await asyncio.sleep(self.delay_s)
        self.delay_s = min(self.delay_s * 2, self._longest_s)

    def reset(self) -> None:
        """After a success: the next failure waits the first delay again."""
        self.delay_s = self._first_s
