"""The back-off between retries of a failing loop (broker.process.backoff)."""

from __future__ import annotations

import time

from broker.process.backoff import FIRST_S, LONGEST_S, Backoff


async def test_each_failure_doubles_the_wait_up_to_the_longest() -> None:
    backoff = Backoff(first_s=0.001, longest_s=0.004)
    delays = []
    for _ in range(4):
        delays.append(backoff.delay_s)
        await backoff.wait()
    assert delays == [0.001, 0.002, 0.004, 0.004]


async def test_a_wait_sleeps_the_announced_delay() -> None:
    backoff = Backoff(first_s=0.05)
    started = time.monotonic()
    await backoff.wait()
    assert time.monotonic() - started >= 0.05


async def test_a_success_starts_over_from_the_first_delay() -> None:
    backoff = Backoff(first_s=0.001)
    await backoff.wait()
    await backoff.wait()
    backoff.reset()
    assert backoff.delay_s == 0.001


def test_the_defaults_are_50_ms_to_2_s() -> None:
    assert (Backoff().delay_s, FIRST_S, LONGEST_S) == (0.05, 0.05, 2.0)
