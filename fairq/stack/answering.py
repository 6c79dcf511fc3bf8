"""Waiting for a server that is starting to answer: poll a URL until it answers 200.

One HTTP client serves the whole wait. A new client per poll (``httpx.get``) builds a TLS
context and loads the CA bundle each time: ~50 ms of CPU, which a poll every 0.1 s spends
beside the very processes it waits for.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

POLL_S = 0.1


def wait_answering(url: str, timeout_s: float, *, alive: Callable[[], bool] = lambda: True) -> bool:
    """True once ``url`` answers 200; False past ``timeout_s``, or as soon as ``alive()``
    is False (the process that would answer has exited). Connection errors and other
    statuses count as "not yet"."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as http:
        while time.monotonic() < deadline and alive():
            try:
                if http.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)
    return False
