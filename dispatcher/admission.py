"""Admission: may we send to this endpoint now, and which endpoint (pure, no I/O).

For now a static in-flight cap per endpoint: an endpoint has room for
``cap - inflight`` more jobs, where in-flight counts jobs dispatched to it and
not yet ended (kept in Redis by the dispatch, complete and cancel scripts).
Metric-driven backpressure replaces the cap as the primary signal later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    endpoint: str
    room: int


def room(inflight: int, cap: int) -> int:
    return max(0, cap - inflight)


def choose_endpoint(
    endpoints: Sequence[str], inflight: Mapping[str, int], cap: int
) -> Admission | None:
    """The endpoint with the most room (first listed on ties), or None when all are full."""
    best: Admission | None = None
    for endpoint in endpoints:
        free = room(inflight.get(endpoint, 0), cap)
        if free > 0 and (best is None or free > best.room):
            best = Admission(endpoint, free)
    return best
