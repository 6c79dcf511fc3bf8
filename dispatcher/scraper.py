"""Engine scraping: poll every endpoint's ``/metrics`` and keep the latest view of each (I/O).

Each endpoint has its own loop on a fixed time grid (``interval_s`` apart, so
the scrape's own duration does not accumulate as drift) and its own total
timeout, so a slow or hanging engine never delays the others. A loop that
overran skips the ticks it missed instead of bursting to catch up.

Health: a scrape fails on a connection error, a timeout, a status other than
200, or text ``parse_metrics`` rejects. ``unhealthy_after`` failures in a row
make the endpoint unhealthy until the next good scrape. An endpoint is also
not healthy before its first good scrape: unknown is not healthy, so admission
never acts on metrics it has not seen. The last good sample is kept through
failures; its ``scraped_at`` tells the reader how stale it is.

Just before each scrape, ``unseen(endpoint)`` reads how many of fairq's jobs the
sample cannot show: on their way to the engine (dispatched, not yet handed
over), or handed over so recently that the engine's gauges may not count them
yet (``broker.Unseen``). The view keeps those counts beside the sample. When they cannot be
read (None: Redis unreachable) the scrape is skipped and the view ages, so
admission falls back as for stale metrics rather than trusting half a picture.

After every attempt, good or bad, ``on_update(endpoint)`` lets the dispatcher
re-run admission at once. ``scrape_after`` asks for one extra scrape soon,
off the grid: when only recent sends hold admission back, the next sample may
show that they have left the engine's queue.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import httpx

from broker import Unseen
from dispatcher.engine_metrics import EngineSample, MetricsError, parse_metrics, recent_tpot_s

log = logging.getLogger(__name__)


_NOTHING_UNSEEN = Unseen(0, 0)


@dataclass(frozen=True)
class EndpointView:
    sample: EngineSample | None = None  # last good sample
    scraped_at: float | None = None  # clock() when the last good scrape was sent
    unseen: Unseen = _NOTHING_UNSEEN  # fairq's jobs the sample cannot show (module docstring)
    tpot_s: float | None = None  # mean time per output token between the last two good scrapes
    failures: int = 0  # consecutive failed scrapes
    healthy: bool = False  # a good scrape seen, and fewer than `unhealthy_after` failures since
    error: str | None = None  # why the last scrape failed; None after a good one
    batch_seen: int = 0  # the engine's batch, as learned (``learned_batch``)


_UNKNOWN = EndpointView()


_FULL_STEPS = 2  # engine steps between two scrapes that show a full batch (below)


def learned_batch(known: int, previous: EngineSample | None, current: EngineSample) -> int:
    """The engine's batch (how many requests it runs at once), learned from two scrapes:
    requests waited at both, the batch did not grow in between, and the engine made at
    least ``_FULL_STEPS`` steps meanwhile (each step admits what a free slot can take), so
    the waiting was for a slot. Waiting through one long prefill step, or a scrape interval
    shorter than a step, shows nothing: a batch learned too small would throttle every
    user already in the engine. Steps come from the engine's step counter where it has one,
    else from its output tokens (every running request emits one per decode step). Only
    ever rises: a batch seen full once is the engine's size."""
    if previous is None or previous.waiting <= 0 or current.waiting <= 0:
        return known
    if current.running > previous.running or current.running <= 0:
        return known
    if _steps_between(previous, current) < _FULL_STEPS:
        return known
    return max(known, int(current.running))


def _steps_between(previous: EngineSample, current: EngineSample) -> float:
    if previous.steps is not None and current.steps is not None:
        return current.steps - previous.steps
    if previous.generated is not None and current.generated is not None:
        return (current.generated - previous.generated) / max(current.running, 1.0)
    return 0.0


class _ScrapeFailed(Exception):
    """One failed attempt; the message says why (it ends up in logs and the view)."""


class Scraper:
    def __init__(
        self,
        endpoints: Sequence[str],
        http: httpx.AsyncClient,
        *,
        interval_s: float = 0.2,
        timeout_s: float = 1.0,
        unhealthy_after: int = 2,
        model_names: Mapping[str, str] | None = None,
        on_update: Callable[[str], None] | None = None,
        unseen: Callable[[str], Awaitable[Unseen | None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0 or unhealthy_after < 1:
            raise ValueError("interval_s and timeout_s must be > 0, unhealthy_after >= 1")
        self._endpoints = tuple(dict.fromkeys(endpoints))
        self._http = http
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._unhealthy_after = unhealthy_after
        self._model_names = dict(model_names or {})
        self._on_update = on_update
        self._unseen = unseen
        self._clock = clock
        self._views = {endpoint: EndpointView() for endpoint in self._endpoints}
        # One scrape per endpoint at a time: an older answer landing after a newer
        # one would move the sample backwards and read as a counter reset.
        self._locks = {endpoint: asyncio.Lock() for endpoint in self._endpoints}
        self._loops: dict[str, asyncio.Task[None]] | None = None  # while ``run`` runs
        self._extra: dict[str, asyncio.Task[None]] = {}  # pending ``scrape_after``

    def view(self, endpoint: str) -> EndpointView:
        """The latest view; an endpoint not watched (yet, or any more: a model whose lease
        moved while its round ran) is unknown, so unhealthy, so admitted nothing."""
        return self._views.get(endpoint, _UNKNOWN)

    async def run(self) -> None:
        """Scrape every endpoint every ``interval_s`` until cancelled; failures never raise."""
        self._loops = {}
        try:
            for endpoint in self._endpoints:
                self._start(endpoint)
            await asyncio.Future()  # until cancelled
        finally:
            loops, self._loops = self._loops, None
            tasks = [*loops.values(), *self._extra.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def watch(self, endpoints: Sequence[str]) -> None:
        """Scrape exactly ``endpoints`` from now on: views of the ones kept stay, new ones
        start unknown (so unhealthy until their first good scrape), dropped ones stop."""
        wanted = tuple(dict.fromkeys(endpoints))
        for endpoint in set(self._endpoints) - set(wanted):
            if self._loops is not None and endpoint in self._loops:
                self._loops.pop(endpoint).cancel()
            del self._views[endpoint], self._locks[endpoint]
        for endpoint in wanted:
            if endpoint not in self._views:
                self._views[endpoint] = EndpointView()
                self._locks[endpoint] = asyncio.Lock()
                self._start(endpoint)
        self._endpoints = wanted

    def scrape_after(self, endpoint: str, delay_s: float) -> None:
        """One extra scrape of ``endpoint`` in ``delay_s`` (at most one pending per
        endpoint, and only while ``run`` runs)."""
        if self._loops is None or endpoint not in self._views or endpoint in self._extra:
            return
        self._extra[endpoint] = asyncio.create_task(self._scrape_later(endpoint, delay_s))

    async def _scrape_later(self, endpoint: str, delay_s: float) -> None:
        try:
            await asyncio.sleep(delay_s)
            if endpoint in self._views:
                await self._scrape(endpoint)
        finally:
            self._extra.pop(endpoint, None)

    def _start(self, endpoint: str) -> None:
        if self._loops is not None:
            task = asyncio.create_task(self._loop(endpoint), name=f"scrape {endpoint}")
            self._loops[endpoint] = task

    async def scrape_once(self) -> None:
        """One round over all endpoints, concurrently; returns when every attempt ended."""
        await asyncio.gather(*(self._scrape(endpoint) for endpoint in self._endpoints))

    async def _loop(self, endpoint: str) -> None:
        # The event loop's clock, not `self._clock`: it is the one asyncio.sleep obeys.
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            await self._scrape(endpoint)
            due += self._interval_s
            now = loop.time()
            if due < now:
                due += math.ceil((now - due) / self._interval_s) * self._interval_s
            await asyncio.sleep(due - now)

    async def _scrape(self, endpoint: str) -> None:
        async with self._locks[endpoint]:
            # Sent time, not received time: what fairq admitted while the request was
            # in flight counts as not yet visible in the sample, the cautious side.
            sent_at = self._clock()
            unseen = _NOTHING_UNSEEN if self._unseen is None else await self._unseen(endpoint)
            if unseen is None:
                log.debug("scrape of %s skipped: fairq's own counts are unreadable", endpoint)
                return
            try:
                sample = await self._fetch(endpoint)
            except _ScrapeFailed as exc:
                self._record_failure(endpoint, str(exc))
            else:
                self._record_success(endpoint, sample, sent_at, unseen)
        self._notify(endpoint)

    async def _fetch(self, endpoint: str) -> EngineSample:
        try:
            # httpx's timeout bounds each phase; asyncio's bounds the whole exchange,
            # so an engine trickling bytes cannot hold a scrape open for long.
            async with asyncio.timeout(self._timeout_s):
                response = await self._http.get(f"{endpoint}/metrics", timeout=self._timeout_s)
        except TimeoutError:
            raise _ScrapeFailed(f"no answer within {self._timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise _ScrapeFailed(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != httpx.codes.OK:
            raise _ScrapeFailed(f"HTTP {response.status_code}")
        try:
            return parse_metrics(response.text, self._model_names.get(endpoint))
        except MetricsError as exc:
            raise _ScrapeFailed(str(exc)) from exc

    def _record_success(
        self, endpoint: str, sample: EngineSample, sent_at: float, unseen: Unseen
    ) -> None:
        old = self._views[endpoint]
        if old.failures >= self._unhealthy_after:
            log.info("metrics of %s are back after %d failed scrapes", endpoint, old.failures)
        self._views[endpoint] = EndpointView(
            sample=sample,
            scraped_at=sent_at,
            unseen=unseen,
            tpot_s=recent_tpot_s(old.sample, sample),
            healthy=True,
            batch_seen=learned_batch(old.batch_seen, old.sample, sample),
        )

    def _record_failure(self, endpoint: str, reason: str) -> None:
        old = self._views[endpoint]
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
