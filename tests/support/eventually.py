"""The one way a test waits for something to happen: poll until it holds, or fail saying
what did not happen and what was last seen.

``eventually(check, what)`` calls ``check`` until ``until`` holds for what it returns
(by default: until it returns something truthy) and returns that value. Past
``timeout_s`` it fails with ``what`` and the last value. ``aeventually`` does the same in
an event loop, sleeping without blocking it, and awaits a ``check`` that returns an
awaitable (the ``a`` as in httpx's ``aclose``).

An exception of a type in ``ignoring`` counts as "not yet" (a server still starting up
refuses connections); any other exception, a failed ``assert`` in ``check`` included
(say, the process waited on has exited), ends the wait at once.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

WAIT_S = 15.0
INTERVAL_S = 0.02


def eventually(
    check: Callable[[], T],
    what: str,
    timeout_s: float = WAIT_S,
    *,
    until: Callable[[T], object] = bool,
    interval_s: float = INTERVAL_S,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        last: object
        try:
            last = value = check()
        except ignoring as exc:
            last = exc
        else:
            if until(value):
                return value
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(what, timeout_s, last))
        time.sleep(interval_s)


async def aeventually(
    check: Callable[[], T | Awaitable[T]],
    what: str,
    timeout_s: float = WAIT_S,
    *,
    until: Callable[[T], object] = bool,
    interval_s: float = INTERVAL_S,
    ignoring: tuple[type[Exception], ...] = (),
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        last: object
        try:
            last = value = await _awaited(check())
        except ignoring as exc:
            last = exc
        else:
            if until(value):
                return value
        if time.monotonic() >= deadline:
            raise AssertionError(_timed_out(what, timeout_s, last))
        await asyncio.sleep(interval_s)


async def _awaited(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


def _timed_out(what: str, timeout_s: float, last: Any) -> str:
    shown = repr(last)
    if len(shown) > 2000:
        shown = shown[:2000] + "..."
    return f"timed out after {timeout_s:g} s waiting for {what}; last seen: {shown}"
