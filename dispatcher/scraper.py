"""Engine scraping: read every endpoint's ``/metrics`` and keep the latest view of each (I/O).

Timing: one driver keeps a grid of ticks ``interval_s`` apart on the event loop's clock
(so a scrape's own duration does not accumulate as drift). At each tick it starts the
scrape of every endpoint due, each in a task of its own with its own total timeout, so a
slow or hanging engine never delays the others; an endpoint still being read at its tick
skips it instead of bursting to catch up. One timer serves every endpoint.

Adaptive: an endpoint whose last good scrape showed nothing waiting or running in the
engine, and none of fairq's jobs unseen (below), with nothing sent to it since, is quiet:
it is read only every ``idle_interval_s`` (on the same grid). ``wake(endpoint)`` -- fairq
sent it a job -- makes it busy at once: it is read at the next tick and every tick after.
The first request after idle never waits for a scrape: admission counts fairq's own jobs
sent since the last one (lag-free), and the caller keeps ``idle_interval_s`` within the
age at which metrics go stale, so the quiet sample is still the one admission trusts.

A scrape: ``unseen(endpoint)`` (below), one GET (``fetch``; by default a kept-alive
connection of ``dispatcher.metrics_http``), the lines admission reads
(``engine_metrics.wanted_lines``). When those are byte for byte the ones of the
endpoint's last good scrape (an idle engine's page changes only in lines admission does
not read), their sample stands; else ``parse_wanted`` reads them.

Health: a scrape fails on a connection error, a timeout, a status other than 200, a
content type that is not Prometheus text, or lines ``parse_wanted`` rejects.
``unhealthy_after`` failures in a row make the endpoint unhealthy until the next good
scrape. An endpoint is also not healthy before its first good scrape: unknown is not
healthy, so admission never acts on metrics it has not seen. The last good sample is kept
through failures; its ``scraped_at`` tells the reader how stale it is.

Just before each scrape, ``unseen(endpoint, start_s)`` reads how many of fairq's jobs
the sample cannot show: on their way to the engine (dispatched, not yet handed
over), or handed over so recently that the engine's gauges may not count them
yet (``broker.Unseen``); and those handed over streamed within ``start_s`` (the start
window, ``capacity.start_window_s``) without a first token, which wait only for the
engine's next step (``dispatcher.capacity``). The view keeps those counts beside the
sample. When they cannot be read (None: Redis unreachable) the scrape is skipped and
the view ages, so admission falls back as for stale metrics rather than trusting half
a picture.

After every attempt, good or bad, ``on_update(endpoint)`` lets the dispatcher
re-run admission at once. ``scrape_after`` asks for one extra scrape soon,
off the grid: when only recent sends hold admission back, the next sample may
show that they have left the engine's queue.

Budget: a scrape costs the engine's API server the rendering of its page (vLLM 0.32's
CPU build: 3.4 ms of CPU for 48 KB, 7 ms of wall time under load), on the process that
also takes requests in and streams tokens out. An endpoint is never read again sooner
than its last good read's wall time divided by ``budget`` after that read began, grid
tick or extra scrape alike: with the dispatcher's default of 2% (``scrape_budget``), an
engine that answers in 7 ms is read at most every 350 ms, one that answers in 1 ms as the
grid says. (Against the real vLLM at one
scrape every ~60 ms under a flood, the scrapes cost the engine about 7% of its tokens/s.)
The budget never spaces reads wider than a quiet endpoint's (``idle_interval_s``), which
the caller keeps within the age at which metrics go stale: a read's wall time is the
engine's rendering plus every wait on a loaded machine (at 2%, a 40 ms read would hold
the next for 2 s), and metrics gone stale stop admission, newcomers' included.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from broker import Unseen
from dispatcher.capacity import Capacity, confirm_delay_s, start_window_s
from dispatcher.engine_metrics import (
    EngineSample,
    MetricsError,
    PaceWindow,
    next_pace_window,
    parse_wanted,
    recent_tpot_s,
    wanted_lines,
)
from dispatcher.metrics_http import FetchError, MetricsClient, Page

log = logging.getLogger(__name__)


_NOTHING_UNSEEN = Unseen(0, 0)
_NOTHING_LEARNED = Capacity()


@dataclass(frozen=True)
class EndpointView:
    sample: EngineSample | None = None  # last good sample
    scraped_at: float | None = None  # clock() when the last good scrape was sent
    unseen: Unseen = _NOTHING_UNSEEN  # fairq's jobs the sample cannot show (module docstring)
    tpot_s: float | None = None  # mean time per output token between the last two good scrapes
    failures: int = 0  # consecutive failed scrapes
    healthy: bool = False  # a good scrape seen, and fewer than `unhealthy_after` failures since
    error: str | None = None  # why the last scrape failed; None after a good one
    capacity: Capacity = _NOTHING_LEARNED  # what the scrapes showed of its running set
    # How fast the engine ends requests, and its step, over the last second or more (None:
    # it does not count its ended requests)
    pace: PaceWindow | None = None


_UNKNOWN = EndpointView()


_PROMETHEUS_TYPES = ("text/plain", "application/openmetrics-text")
_SLACK_S = 0.001  # a timer may fire this much early: its tick is still due
_IDLE_TICKS = 1000  # with no endpoint due before, the driver looks again after this many

Fetch = Callable[[str, float], Awaitable[Page]]  # (URL, timeout_s) -> the response; FetchError


class _ScrapeFailed(Exception):
    """One failed attempt; the message says why (it ends up in logs and the view)."""


class _Endpoint:
    """The scraper's own state of one endpoint (the view is what others read)."""

    __slots__ = (
        "confirm_at", "confirming", "extra_at", "lines", "lock", "next_tick", "not_before",
        "quiet", "task", "woken",
    )  # fmt: skip

    def __init__(self, next_tick: int) -> None:
        self.next_tick = next_tick  # the grid tick of its next scrape
        self.extra_at: float | None = None  # an extra scrape off the grid (loop time)
        # When the last read that confirms a capacity (``_confirm``) was asked for
        self.confirm_at = -math.inf
        self.confirming = False  # the extra scrape pending confirms one: outside the budget
        self.not_before = 0.0  # the budget: no scrape starts before (loop time)
        self.quiet = False  # read every idle interval only (module docstring)
        self.woken = False  # fairq sent it a job since its last scrape began
        self.lines: bytes | None = None  # the wanted lines of its last good scrape
        self.task: asyncio.Task[None] | None = None  # the scrape under way, if any
        # One scrape per endpoint at a time: an older answer landing after a newer
        # one would move the sample backwards and read as a counter reset.
        self.lock = asyncio.Lock()


class Scraper:
    def __init__(
        self,
        endpoints: Sequence[str],
        fetch: Fetch | None = None,
        *,
        interval_s: float = 0.2,
        idle_interval_s: float | None = None,
        timeout_s: float = 1.0,
        budget: float = 1.0,
        unhealthy_after: int = 2,
        model_names: Mapping[str, str] | None = None,
        on_update: Callable[[str], None] | None = None,
        unseen: Callable[[str, float], Awaitable[Unseen | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``fetch`` None: kept-alive connections of this scraper's own (closed when ``run``
        ends). ``idle_interval_s`` None: quiet endpoints are read as often as the others;
        else it is rounded to a whole number of intervals. ``budget``: the share of the
        time an endpoint spends rendering its page for this scraper at most, spacing reads
        no wider than ``idle_interval_s`` (module docstring); 1: no bound but one read at
        a time."""
        if interval_s <= 0 or timeout_s <= 0 or unhealthy_after < 1 or not 0 < budget <= 1:
            raise ValueError(
                "interval_s and timeout_s must be > 0, unhealthy_after >= 1, 0 < budget <= 1"
            )
        self._budget = budget
        self._client: MetricsClient | None = None
        if fetch is None:
            self._client = MetricsClient()
            fetch = self._client.get
        self._fetch_page = fetch
        self._interval_s = interval_s
        self._quiet_ticks = max(1, round((idle_interval_s or interval_s) / interval_s))
        self._widest_gap_s = idle_interval_s or math.inf  # the budget's bound (docstring)
        self._confirm_every_s = idle_interval_s or interval_s * 5  # reads past the budget
        self._timeout_s = timeout_s
        self._unhealthy_after = unhealthy_after
        self._model_names = dict(model_names or {})
        self._on_update = on_update
        self._unseen = unseen
        self._clock = clock
        self._endpoints = tuple(dict.fromkeys(endpoints))
        self._views = {endpoint: EndpointView() for endpoint in self._endpoints}
        self._state = {endpoint: _Endpoint(0) for endpoint in self._endpoints}
        self._loop: asyncio.AbstractEventLoop | None = None  # while ``run`` runs
        self._start_at = 0.0  # the grid's tick 0 (loop time)
        self._wakeup: asyncio.Future[None] | None = None  # the driver's sleep

    def view(self, endpoint: str) -> EndpointView:
        """The latest view; an endpoint not watched (yet, or any more: a model whose lease
        moved while its round ran) is unknown, so unhealthy, so admitted nothing."""
        return self._views.get(endpoint, _UNKNOWN)

    def quiet(self, endpoint: str) -> bool:
        """Whether ``endpoint`` is read at the idle interval now."""
        state = self._state.get(endpoint)
        return state is not None and state.quiet

    async def run(self) -> None:
        """Scrape every endpoint on the grid until cancelled; failures never raise."""
        loop = self._loop = asyncio.get_running_loop()
        self._start_at = loop.time()
        for state in self._state.values():
            state.next_tick = 0
        try:
            while True:
                next_at = self._start_due(loop.time())
                self._wakeup = loop.create_future()
                timer = loop.call_at(next_at, _resolve, self._wakeup)
                try:
                    await self._wakeup
                finally:
                    timer.cancel()
        finally:
            self._loop = self._wakeup = None
            tasks = [s.task for s in self._state.values() if s.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.close()

    def close(self) -> None:
        """Close the scraper's own connections (``run`` does when it ends)."""
        if self._client is not None:
            self._client.close()

    def watch(self, endpoints: Sequence[str]) -> None:
        """Scrape exactly ``endpoints`` from now on: views of the ones kept stay, new ones
        start unknown (so unhealthy until their first good scrape, which is at once), dropped
        ones stop."""
        wanted = tuple(dict.fromkeys(endpoints))
        for endpoint in set(self._endpoints) - set(wanted):
            state = self._state.pop(endpoint)
            if state.task is not None:
                state.task.cancel()
            del self._views[endpoint]
            if self._client is not None:
                self._client.drop(_metrics_url(endpoint))
        for endpoint in wanted:
            if endpoint not in self._views:
                self._views[endpoint] = EndpointView()
                state = self._state[endpoint] = _Endpoint(self._tick(self._now()) + 1)
                state.extra_at = self._now()
        self._endpoints = wanted
        self._kick()

    def wake(self, endpoint: str) -> None:
        """fairq sent ``endpoint`` a job: read it at the next tick and every tick after,
        until a scrape finds it quiet again."""
        state = self._state.get(endpoint)
        if state is None:
            return
        state.woken = True
        if state.quiet:
            state.quiet = False
            state.next_tick = min(state.next_tick, self._tick(self._now()) + 1)
            self._kick()

    def scrape_after(self, endpoint: str, delay_s: float) -> None:
        """One extra scrape of ``endpoint`` in ``delay_s`` (at most one pending per
        endpoint, and only while ``run`` runs)."""
        state = self._state.get(endpoint)
        if self._loop is None or state is None or state.extra_at is not None:
            return
        state.extra_at = self._now() + delay_s
        self._kick()

    def _confirm(self, endpoint: str, view: EndpointView) -> None:
        """The sample just read shows requests waiting at a running set not known full: read
        again a few engine steps later, outside the budget (``dispatcher.capacity``), at
        most once per quiet interval once a capacity is known (a flood's start is what
        must not wait a budget's second)."""
        state = self._state.get(endpoint)
        if state is None or self._loop is None:
            return
        now = self._now()
        if view.capacity.known and now - state.confirm_at < self._confirm_every_s:
            return
        state.confirm_at, state.confirming = now, True
        due = now + confirm_delay_s(view.tpot_s)
        state.extra_at = due if state.extra_at is None else min(state.extra_at, due)
        self._kick()

    async def scrape_once(self) -> None:
        """One round over all endpoints, concurrently; returns when every attempt ended."""
        await asyncio.gather(*(self._scrape(endpoint) for endpoint in self._endpoints))

    # --- the grid ---

    def _now(self) -> float:
        return self._loop.time() if self._loop is not None else 0.0

    def _tick(self, now: float) -> int:
        return math.floor((now + _SLACK_S - self._start_at) / self._interval_s)

    def _kick(self) -> None:
        """Let the driver look again at who is due (its sleep ends now)."""
        if self._wakeup is not None:
            _resolve(self._wakeup)

    def _start_due(self, now: float) -> float:
        """Start the scrape of every endpoint due at ``now``; returns when one is due next
        (the driver sleeps until then: while every endpoint is quiet, it wakes only for
        theirs, not at every tick)."""
        assert self._loop is not None
        tick = self._tick(now)
        next_tick, next_extra = tick + _IDLE_TICKS, math.inf
        for endpoint, state in self._state.items():
            due = state.next_tick <= tick
            extra = state.extra_at is not None and state.extra_at <= now + _SLACK_S
            budget_held = now + _SLACK_S < state.not_before and not (extra and state.confirming)
            if state.task is not None or budget_held:
                # Still being read, or read too recently for the budget: it skips this tick
                # (an extra scrape waits for the budget).
                if due:
                    state.next_tick = tick + 1
            elif due or extra:
                if due:
                    state.next_tick = tick + (self._quiet_ticks if state.quiet else 1)
                if extra:
                    state.extra_at, state.confirming = None, False
                state.task = self._loop.create_task(self._scrape(endpoint))
            next_tick = min(next_tick, state.next_tick)
            if state.extra_at is not None and state.task is None:  # else: when it ends
                budget = 0.0 if state.confirming else state.not_before
                next_extra = min(next_extra, max(state.extra_at, budget))
        return min(self._start_at + next_tick * self._interval_s, next_extra)

    # --- one scrape ---

    async def _scrape(self, endpoint: str) -> None:
        state = self._state[endpoint]
        try:
            async with state.lock:
                await self._attempt(endpoint, state)
        finally:
            if state.task is asyncio.current_task():
                state.task = None
                if state.extra_at is not None:
                    self._kick()  # an extra scrape waited for this one
        self._notify(endpoint)

    async def _attempt(self, endpoint: str, state: _Endpoint) -> None:
        # Sent time, not received time: what fairq admitted while the request was
        # in flight counts as not yet visible in the sample, the cautious side.
        sent_at = self._clock()
        started = self._tick(self._now())
        state.woken = False
        unseen: Unseen | None = _NOTHING_UNSEEN
        if self._unseen is not None:
            unseen = await self._unseen(endpoint, start_window_s(self.view(endpoint).tpot_s))
        if unseen is None:
            log.debug("scrape of %s skipped: fairq's own counts are unreadable", endpoint)
            self._set_quiet(state, False, started)
            return
        try:
            sample = await self._fetch(endpoint, state)
        except _ScrapeFailed as exc:
            self._set_quiet(state, False, started)
            self._record_failure(endpoint, str(exc))
            return
        quiet = not state.woken and sample.waiting <= 0 and sample.running <= 0
        self._set_quiet(state, quiet and unseen == _NOTHING_UNSEEN, started)
        self._record_success(endpoint, sample, sent_at, unseen)

    def _set_quiet(self, state: _Endpoint, quiet: bool, started: int) -> None:
        """What a scrape begun at tick ``started`` found: its next tick follows from it."""
        state.quiet = quiet
        if quiet:
            state.next_tick = max(state.next_tick, started + self._quiet_ticks)
        elif self._loop is not None:
            soon = self._tick(self._now()) + 1
            if soon < state.next_tick:  # it was quiet: the driver may sleep past its tick
                state.next_tick = soon
                self._kick()

    async def _fetch(self, endpoint: str, state: _Endpoint) -> EngineSample:
        began = self._now()
        try:
            page = await self._fetch_page(_metrics_url(endpoint), self._timeout_s)
        except FetchError as exc:
            raise _ScrapeFailed(str(exc)) from exc
        # A page it rendered: what that cost bounds the next read (a failure says nothing
        # of the cost; the health rules deal with it).
        state.not_before = began + min((self._now() - began) / self._budget, self._widest_gap_s)
        if page.status != 200:
            raise _ScrapeFailed(f"HTTP {page.status}")
        if page.content_type and not page.content_type.startswith(_PROMETHEUS_TYPES):
            raise _ScrapeFailed(f"not Prometheus text exposition: {page.content_type!r}")
        lines = wanted_lines(page.body)
        old = self.view(endpoint).sample
        if lines == state.lines and old is not None:
            return old  # nothing admission reads has changed
        try:
            sample = parse_wanted(lines, self._model_names.get(endpoint))
        except MetricsError as exc:
            raise _ScrapeFailed(str(exc)) from exc
        state.lines = lines
        return sample

    def _record_success(
        self, endpoint: str, sample: EngineSample, sent_at: float, unseen: Unseen
    ) -> None:
        old = self._views.get(endpoint)
        if old is None:
            return  # no longer watched
        if old.failures >= self._unhealthy_after:
            log.info("metrics of %s are back after %d failed scrapes", endpoint, old.failures)
        self._views[endpoint] = EndpointView(
            sample=sample,
            scraped_at=sent_at,
            unseen=unseen,
            tpot_s=recent_tpot_s(old.sample, sample),
            healthy=True,
            capacity=old.capacity.learn(old.sample, sample, unseen.starting),
            pace=next_pace_window(old.pace, sample, sent_at),
        )
        view = self._views[endpoint]
        if view.capacity.slots != old.capacity.slots and view.capacity.known:
            log.info("%s runs %d requests at once (learned from its metrics)",
                     endpoint, view.capacity.slots)  # fmt: skip
        if view.capacity.confirm:
            self._confirm(endpoint, view)

    def _record_failure(self, endpoint: str, reason: str) -> None:
        old = self._views.get(endpoint)
        if old is None:
            return  # no longer watched
        failures = old.failures + 1
        if failures == self._unhealthy_after:
            log.warning(
                "metrics of %s failed %d scrapes in a row (%s); endpoint unhealthy",
                endpoint,
                failures,
                reason,
            )
        else:
            log.debug("scrape of %s failed: %s", endpoint, reason)
        healthy = old.healthy and failures < self._unhealthy_after
        self._views[endpoint] = replace(old, failures=failures, healthy=healthy, error=reason)

    def _notify(self, endpoint: str) -> None:
        if self._on_update is None:
            return
        try:
            self._on_update(endpoint)
        except Exception:
            # A bug in the consumer must not stop the measuring of every endpoint.
            log.exception("on_update(%r) failed", endpoint)


def _metrics_url(endpoint: str) -> str:
    return f"{endpoint}/metrics"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
