"""What the dispatcher knows about each endpoint, put together for admission.

Three sources meet here: the scraper's view of the engine (its queue, batch,
time per token, health), Redis's counts of fairq's own jobs (in flight, and
sent without a first token yet), and this process's log of what it sent since
each scrape. ``endpoint_states`` is pure: plain values in, ``EndpointState`` out.

An engine that serves several models (``broker.engines``) has one queue and one batch:
its state counts fairq's jobs of every one of them (``others``: the snapshots of the
models it shares the engine with). The scrape is the engine's already (its series of
every model name are summed), and so are the log of sends and the unseen jobs (both are
per endpoint).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from broker import DISPATCH_RATE_WINDOW_S, ModelSnapshot
from dispatcher.admission import EndpointState
from dispatcher.pacing import RefillPace, UnpacedRefills, starting_refills
from dispatcher.scraper import EndpointView

# How long a job that reached the engine may stay out of its metrics: vLLM updates its
# gauges once per engine step. A job handed over this long before a scrape still counts
# as unseen (``DispatchStore.unseen``).
METRICS_LAG_S = 0.05
_UNPACED = UnpacedRefills()


class RateMeter:
    """Jobs per second dispatched over a sliding window (the queue's drain rate).

    Keeps a running total: every round asks for the rate, and summing the window's events
    each time cost the dispatcher O(rounds in the window) per round (py-spy, 10,000 users).
    """

    def __init__(self, window_s: float = DISPATCH_RATE_WINDOW_S) -> None:
        self._window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0  # the sum of the counts in _events
        self._started: float | None = None

    def record(self, count: int, now: float) -> None:
        if self._started is None:
            self._started = now
        if count:
            self._events.append((now, count))
            self._total += count
        while self._events and self._events[0][0] < now - self._window_s:
            self._total -= self._events.popleft()[1]

    def rate(self, now: float) -> float | None:
        if self._started is None or now - self._started < 1.0:
            return None  # too early to say
        span = min(self._window_s, now - self._started)
        return round(self._total / span, 3)


class Sent(NamedTuple):
    total: int
    plain: int  # of them not streamed


class SentLog:
    """When this process dispatched jobs to each endpoint (monotonic times), recent only.

    One (time, count) entry per send, not one per job: ``record`` and ``since`` were
    O(jobs sent in ``keep_s``) on every round (py-spy, thousands of jobs a second).
    ``since`` reads every entry rather than stop at the first older one: it is short, and
    then no caller has to keep the records in time order.
    """

    def __init__(self, keep_s: float) -> None:
        self._keep_s = keep_s
        self._sent: dict[str, deque[tuple[float, int, int]]] = {}

    def record(self, endpoint: str, count: int, now: float, plain: int = 0) -> None:
        """``count`` jobs sent at ``now``, ``plain`` of them not streamed."""
        sent = self._sent.setdefault(endpoint, deque())
        if count:
            sent.append((now, count, plain))
        while sent and sent[0][0] < now - self._keep_s:
            sent.popleft()

    def forget(self, endpoint: str) -> None:
        """``endpoint`` is gone (a replica found through DNS left): its log goes too, so
        that replicas coming and going do not grow the log."""
        self._sent.pop(endpoint, None)

    def since(self, endpoint: str, moment: float) -> Sent:
        """Jobs sent at or after ``moment`` (a scrape sent then may not show them)."""
        recent = [
            (count, plain) for at, count, plain in self._sent.get(endpoint, ()) if at >= moment
        ]
        return Sent(sum(c for c, _ in recent), sum(p for _, p in recent))


def endpoint_states(
    endpoints: Sequence[str],
    snapshot: ModelSnapshot,
    views: Mapping[str, EndpointView] | None,
    sent: SentLog,
    *,
    now: float,
    stale_s: float,
    others: Sequence[ModelSnapshot] = (),
    clearing: Collection[str] = (),
    pace: RefillPace = _UNPACED,
) -> list[EndpointState]:
    """One state per endpoint; ``views`` None means the model does not use metrics.
    ``others``: the latest snapshots of the models that share the engine, whose jobs in
    flight and without a first token count too. ``clearing``: the endpoints whose step is
    kept clear for a newcomer's prefill now (``dispatcher.newcomer_step``). ``pace``: the
    refills each endpoint may take now (``dispatcher.pacing``)."""
    shared = (snapshot, *others)
    states = []
    for ep in endpoints:
        view = None if views is None else views[ep]
        states.append(_state(ep, shared, view, sent, now=now, stale_s=stale_s, pace=pace))
    if not clearing:
        return states
    return [replace(s, newcomer_step=True) if s.endpoint in clearing else s for s in states]


def _state(
    endpoint: str,
    shared: Sequence[ModelSnapshot],
    view: EndpointView | None,
    sent: SentLog,
    *,
    now: float,
    stale_s: float,
    pace: RefillPace,
) -> EndpointState:
    inflight = sum(snap.inflight.get(endpoint, 0) for snap in shared)
    unstarted = sum(snap.unstarted.get(endpoint, 0) for snap in shared)
    if view is None:
        return EndpointState(endpoint, inflight, unstarted)
    sample, scraped_at = view.sample, view.scraped_at
    if sample is None or scraped_at is None:
        return EndpointState(endpoint, inflight, unstarted, healthy=view.healthy)
    since = sent.since(endpoint, scraped_at)
    allowed, due_in = pace.allowed(endpoint, view.pace, now)
    return EndpointState(
        endpoint,
        inflight,
        unstarted,
        healthy=view.healthy,
        fresh=now - scraped_at <= stale_s,
        waiting=sample.waiting,
        running=sample.running,
        tpot_s=view.tpot_s,
        unseen_at_scrape=view.unseen.held,
        unseen_streamed=view.unseen.streamed,
        unstarted_at_scrape=view.unseen.unstarted,
        shown_at_scrape=view.unseen.shown,
        # What was sent before the scrape is in ``unseen`` (on its way, or handed over
        # within the metrics lag) or in the sample: count only the sends after it.
        admitted_since_scrape=since.total,
        plain_since_scrape=since.plain,
        batch_seen=view.capacity.slots,
        full_at=view.capacity.full_at,
        kv_usage=sample.kv_usage,
        pace_allowed=allowed,
        pace_due_in_s=due_in,
        starting_refills=starting_refills(view.pace),
    )
