"""What the dispatcher knows about each endpoint, put together for admission.

Three sources meet here: the scraper's view of the engine (its queue, batch,
time per token, health), Redis's counts of fairq's own jobs (in flight, and
sent without a first token yet), and this process's log of what it sent since
each scrape. ``endpoint_states`` is pure: plain values in, ``EndpointState`` out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from broker import ModelSnapshot
from dispatcher.admission import EndpointState
from dispatcher.scraper import EndpointView

# How long a job that reached the engine may stay out of its metrics: vLLM updates its
# gauges once per engine step. A send this long before a scrape still counts as unseen.
METRICS_LAG_S = 0.05


class RateMeter:
    """Jobs per second dispatched over a sliding window (the queue's drain rate)."""

    def __init__(self, window_s: float = 30.0) -> None:
        self._window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._started: float | None = None

    def record(self, count: int, now: float) -> None:
        if self._started is None:
            self._started = now
        if count:
            self._events.append((now, count))
        while self._events and self._events[0][0] < now - self._window_s:
            self._events.popleft()

    def rate(self, now: float) -> float | None:
        if self._started is None or now - self._started < 1.0:
            return None  # too early to say
        span = min(self._window_s, now - self._started)
        return round(sum(n for _, n in self._events) / span, 3)


class SentLog:
    """When this process dispatched jobs to each endpoint (monotonic times), recent only."""

    def __init__(self, keep_s: float) -> None:
        self._keep_s = keep_s
        self._sent: dict[str, deque[float]] = {}

    def record(self, endpoint: str, count: int, now: float) -> None:
        sent = self._sent.setdefault(endpoint, deque())
        sent.extend([now] * count)
        while sent and sent[0] < now - self._keep_s:
            sent.popleft()

    def since(self, endpoint: str, moment: float) -> int:
        """Jobs sent at or after ``moment`` (a scrape sent then may not show them)."""
        return sum(1 for t in self._sent.get(endpoint, ()) if t >= moment)


def endpoint_states(
    endpoints: Sequence[str],
    snapshot: ModelSnapshot,
    views: Mapping[str, EndpointView] | None,
    sent: SentLog,
    *,
    now: float,
    stale_s: float,
) -> list[EndpointState]:
    """One state per endpoint; ``views`` None means the model does not use metrics."""
    return [
        _state(ep, snapshot, None if views is None else views[ep], sent, now=now, stale_s=stale_s)
        for ep in endpoints
    ]


def _state(
    endpoint: str,
    snapshot: ModelSnapshot,
    view: EndpointView | None,
    sent: SentLog,
    *,
    now: float,
    stale_s: float,
) -> EndpointState:
    inflight = snapshot.inflight.get(endpoint, 0)
    unstarted = snapshot.unstarted.get(endpoint, 0)
    if view is None:
        return EndpointState(endpoint, inflight, unstarted)
    sample, scraped_at = view.sample, view.scraped_at
    if sample is None or scraped_at is None:
        return EndpointState(endpoint, inflight, unstarted, healthy=view.healthy)
    return EndpointState(
        endpoint,
        inflight,
        unstarted,
        healthy=view.healthy,
        fresh=now - scraped_at <= stale_s,
        waiting=sample.waiting,
        running=sample.running,
        tpot_s=view.tpot_s,
        in_transit=view.in_transit,
        admitted_since_scrape=sent.since(endpoint, scraped_at - METRICS_LAG_S),
    )
