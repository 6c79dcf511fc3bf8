"""The dispatcher's status: a snapshot per model into Redis, and its Prometheus series.

Every ``status_interval_s`` the publisher reads the queues of each model this
replica owns (the lease holder: ``dispatcher.ownership``) from Redis
(``broker.status.read_queues``: bounded, whatever the backlog), puts them together
with what only this process knows -- the scraper's view of each engine and the
admission decision per endpoint and band -- and writes the result as the model's
status snapshot (``fq:{m}:status``, short TTL). The same latest view feeds the
Prometheus collector, so a scrape of ``/metrics`` never touches Redis. Each round also
reads the configured quotas' counters (``broker.quota_status``) for the
``fairq_quota_*`` gauges; they belong to no model, so every replica reads and exports
them, the same values from the same Redis (aggregate them with ``max``, not ``sum``).

A round publishes ``_CONCURRENT`` models at a time and the next one starts
``status_interval_s`` after it began, so at many models the period is still the interval
(one model after another, 60 models took about as long as the wait between rounds).
Demand that appears is published at once: a job that comes for a model whose published
demand is 0 (``publish_at_once``: its wake message, ``Dispatcher.when_queued``) has the
model published now, not at the next round, since that series is what wakes its engines
from zero; at most once per model per interval, so a busy model costs no more.

The history (for the dashboard's chart) is built here from the workers' latency
stream: one point every ``HISTORY_STEP_S`` with the queue depth and the median and
95th percentile of the time to first token of the jobs that ended in that step. The
newcomers' TTFT (jobs dispatched while their user had nothing in the engine, the case
the kept batch slots are for) is the median and 95th percentile over the history's
span, at most ``NEWCOMERS_KEPT`` jobs. Each engine row also carries the engine's own
drain (``engine_drain_per_s``): a queued job's wait estimate uses it while fairq sees
no job of its own in the engine (``broker.position``).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import (
    Latency,
    ModelConfig,
    ModelQueues,
    ModelSnapshot,
    QuotaUse,
    Settings,
    Snapshot,
    publish_status,
    read_latencies,
    read_queues,
    read_quotas,
    stop_task,
    telemetry,
    wait_event,
)
from broker.demand import read_oldest_ms
from dispatcher.admission import ADMISSION, AdmissionConfig, EndpointState
from dispatcher.engine_metrics import engine_drain_per_s
from dispatcher.scraper import EndpointView
from dispatcher.service import Dispatcher

log = logging.getLogger(__name__)

_CONCURRENT = 8  # models a round publishes at once (each a few Redis round trips)
HISTORY_STEP_S = 2.0
HISTORY_POINTS = 150  # five minutes
NEWCOMERS_KEPT = 1000  # newcomer TTFTs kept for the quantiles (within the history's span)


@dataclass
class _History:
    """Points [t_ms, queued, ttft_p50_ms, ttft_p95_ms, wait_p50_ms, ended] of one model."""

    points: deque[list[float | None]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    pending: list[Latency] = field(default_factory=list)
    step_end: float = 0.0  # monotonic end of the step being filled
    after: bytes | None = None  # the last latency entry read
    # (monotonic time read, TTFT ms) of the newcomers' streamed jobs, oldest first
    newcomers: deque[tuple[float, int]] = field(
        default_factory=lambda: deque(maxlen=NEWCOMERS_KEPT)
    )

    def add(self, now: float, now_ms: int, queued: int, latencies: list[Latency]) -> None:
        self.newcomers.extend(
            (now, x.ttft_ms) for x in latencies if x.newcomer and x.ttft_ms is not None
        )
        self.pending += latencies
        if now < self.step_end:
            return
        ttfts = sorted(x.ttft_ms for x in self.pending if x.ttft_ms is not None)
        waits = [x.wait_ms for x in self.pending if x.wait_ms is not None]
        self.points.append(
            [
                now_ms,
                queued,
                _quantile(ttfts, 0.5),
                _quantile(ttfts, 0.95),
                statistics.median(waits) if waits else None,
                len(self.pending),
            ]
        )
        self.pending = []
        self.step_end = now + HISTORY_STEP_S

    def newcomer_ttft(self, now: float) -> dict[str, object]:
        """The newcomers' TTFT p50/p95 (ms) over the history's span, and how many jobs."""
        while self.newcomers and self.newcomers[0][0] < now - _HISTORY_SPAN_S:
            self.newcomers.popleft()
        ttfts = sorted(ttft for _, ttft in self.newcomers)
        return {
            "p50": _quantile(ttfts, 0.5),
            "p95": _quantile(ttfts, 0.95),
            "jobs": len(ttfts),
            "window_s": _HISTORY_SPAN_S,
        }


_HISTORY_SPAN_S = HISTORY_STEP_S * HISTORY_POINTS


def _quantile(ordered: Sequence[int], q: float) -> float | None:
    if not ordered:
        return None
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


@dataclass(frozen=True)
class ModelStatus:
    """The latest view of one model, as published."""

    queues: ModelQueues
    endpoints: list[dict[str, object]]
    # band -> enqueue time (ms since the epoch) of its oldest queued job; None: none queued
    oldest_ms: dict[str, int | None] = field(default_factory=dict)

    @property
    def demand(self) -> int:
        """Jobs queued in every band plus jobs in flight: what scales the model's engines."""
        return sum(self.queues.inflight.values()) + sum(b.queued for b in self.queues.bands)


def publish_at_once(
    status: ModelStatus | None, last_at: float | None, now: float, interval_s: float
) -> bool:
    """Whether a job that came for a model has the model published now: its published
    demand was 0 (or nothing is published yet), and it was not published so in the last
    ``interval_s`` (``last_at``: when it last was; None: never)."""
    if status is not None and status.demand > 0:
        return False
    return last_at is None or now - last_at >= interval_s


class StatusPublisher:
    def __init__(self, settings: Settings, redis: Redis, dispatcher: Dispatcher) -> None:
        self._settings = settings
        self._redis = redis
        self._dispatcher = dispatcher
        self._history = {m.name: _History() for m in dispatcher.models}
        self.latest: dict[str, ModelStatus] = {}
        self.quotas: list[QuotaUse] = []  # the configured quotas at the last round
        self._due: set[str] = set()  # models to publish at once
        self._at_once: dict[str, float] = {}  # model -> when it was last published at once
        self._poke: asyncio.Event | None = None  # while ``run`` runs: a model is due
        dispatcher.when_queued(self._queued)

    async def run(self, stop: asyncio.Event) -> None:
        """Publish the snapshot of every model this replica owns every ``status_interval_s``,
        and a model whose demand appears at once, until ``stop``."""
        self._poke = poke = asyncio.Event()
        stopping = asyncio.create_task(_set_on(stop, poke))
        interval_s = self._settings.status_interval_s
        try:
            next_round = time.monotonic()
            while not stop.is_set():
                poke.clear()  # before the work: a model due meanwhile is not lost
                began = time.monotonic()
                if began >= next_round:
                    next_round = began + interval_s  # the round's own time is in the period
                    self._due.clear()
                    await self._round()
                elif self._due:
                    due, self._due = self._due, set()
                    owned = self._dispatcher.owned
                    await self._publish_each(
                        [m for m in self._dispatcher.models if m.name in due and m.name in owned]
                    )
                await wait_event(poke, next_round - time.monotonic())
        finally:
            self._poke = None
            await stop_task(stopping)

    async def _round(self) -> None:
        owned = self._dispatcher.owned  # the lease holder of a model publishes its status
        for name in set(self.latest) - owned:
            del self.latest[name]
        await asyncio.gather(
            self._publish_each([m for m in self._dispatcher.models if m.name in owned]),
            self.refresh_quotas(),
        )

    async def refresh_quotas(self) -> None:
        """The quotas' use for the gauges: no model's, so every replica reads them, one
        pipelined read a round; a failure keeps the last."""
        try:
            self.quotas = await read_quotas(self._redis, self._settings.quotas)
        except RedisError as exc:
            log.warning("quotas not read (%s)", exc)

    async def _publish_each(self, models: Sequence[ModelConfig]) -> None:
        """Publish ``models``, ``_CONCURRENT`` at a time; a failure is logged, not raised."""
        slots = asyncio.Semaphore(_CONCURRENT)

        async def one(model: ModelConfig) -> None:
            async with slots:
                try:
                    await self.publish(model)
                except RedisError as exc:
                    log.warning("status of model %s not published (%s)", model.name, exc)

        await asyncio.gather(*(one(model) for model in models))

    def _queued(self, model: str) -> None:
        """A job came for ``model`` (its wake message): publish it at once if its published
        demand was 0 (``publish_at_once``)."""
        if self._poke is None or model in self._due or model not in self._dispatcher.owned:
            return
        now = time.monotonic()
        interval_s = self._settings.status_interval_s
        if publish_at_once(self.latest.get(model), self._at_once.get(model), now, interval_s):
            self._at_once[model] = now
            self._due.add(model)
            self._poke.set()

    async def publish(self, model: ModelConfig) -> Snapshot:
        s = self._settings
        queues = await read_queues(self._redis, model.name, s.bands, s.status_top_users)
        history = self._history[model.name]
        latencies, history.after = await read_latencies(self._redis, model.name, history.after)
        now, now_ms = time.monotonic(), int(time.time() * 1000)
        history.add(now, now_ms, sum(b.queued for b in queues.bands), latencies)
        endpoints = self._endpoints(model, queues)
        oldest = await read_oldest_ms(self._redis, model.name, s.bands)
        self.latest[model.name] = ModelStatus(queues, endpoints, oldest)
        snapshot = Snapshot(
            model.name,
            now_ms,
            "dispatcher",
            queues.public(),
            endpoints,
            [list(p) for p in history.points],
            model.policy,
            model.admission_policy,
            self._dispatcher.name,
            history.newcomer_ttft(now),
        )
        await publish_status(self._redis, snapshot)
        return snapshot

    def _endpoints(self, model: ModelConfig, queues: ModelQueues) -> list[dict[str, object]]:
        snap = ModelSnapshot([], queues.inflight, queues.unstarted)
        states = self._dispatcher.endpoint_states(model, snap)
        policy = ADMISSION[model.admission_policy]
        config = AdmissionConfig.of(model, self._settings.bands)
        now = time.monotonic()
        rows = []
        for state in states:
            row = _engine_row(state, self._dispatcher.engine_view(model, state.endpoint), now)
            row["admission"] = {
                band: {"room": d.room, "served_room": d.room_for_served, "limit": d.limit.value}
                for band in self._settings.bands
                for d in [policy.decide(state, band, config)]
            }
            batch = config.batch(state)
            row["batch_slots"] = batch
            row["kept_slots"] = None if batch is None else config.reserve(batch)
            view = self._dispatcher.engine_view(model, state.endpoint)
            learned = view.capacity.slots if view is not None else 0
            row["batch_learned"] = learned or None
            why = None if view is None else view.capacity.disagrees(config.batch_slots)
            row["batch_slots_disagree"] = why
            rows.append(row)
        return rows


async def _set_on(stop: asyncio.Event, poke: asyncio.Event) -> None:
    """Set ``poke`` once ``stop`` is set: the publisher waits on one event."""
    await stop.wait()
    poke.set()


def _engine_row(state: EndpointState, view: EndpointView | None, now: float) -> dict[str, object]:
    row: dict[str, object] = {
        "url": state.endpoint,
        "inflight": state.inflight,
        "unstarted": state.unstarted,
        "healthy": state.healthy,
        "fresh": state.fresh,
        "queue_estimate": state.queue_estimate,
    }
    row["scraped"] = view is not None
    if view is None:  # admission by static cap: the engine is not scraped
        return row
    sample = view.sample
    row.update(
        waiting=sample.waiting if sample else None,
        running=sample.running if sample else None,
        kv_usage=sample.kv_usage if sample else None,
        tpot_ms=None if view.tpot_s is None else round(view.tpot_s * 1000, 2),
        drain_per_s=_drain(view),
        metrics_age_s=None if view.scraped_at is None else round(now - view.scraped_at, 3),
        error=view.error,
    )
    return row


def _drain(view: EndpointView) -> float | None:
    """The engine's requests ended per second, from a healthy view only."""
    drain = engine_drain_per_s(view.sample) if view.healthy and view.sample else None
    return None if drain is None else round(drain, 3)


# -- Prometheus ---------------------------------------------------------------------

_ENGINE_GAUGES = (  # row field -> series
    ("waiting", telemetry.ENGINE_WAITING),
    ("running", telemetry.ENGINE_RUNNING),
    ("kv_usage", telemetry.ENGINE_KV_USAGE),
    ("metrics_age_s", telemetry.ENGINE_METRICS_AGE),
    ("inflight", telemetry.ENGINE_INFLIGHT),
    ("queue_estimate", telemetry.ENGINE_QUEUE_ESTIMATE),
)


class DispatcherCollector(Collector):
    """Prometheus series from the publisher's latest view (no Redis at scrape time)."""

    def __init__(self, publisher: StatusPublisher) -> None:
        self._publisher = publisher

    def collect(self) -> Iterator[Metric]:
        latest = dict(self._publisher.latest)
        yield from _queue_families(latest)
        yield from _demand_families(latest, time.time())
        yield from _engine_families(latest)
        yield from _quota_families(self._publisher.quotas)


def _queue_families(latest: dict[str, ModelStatus]) -> Iterator[Metric]:
    depth = telemetry.QUEUE_DEPTH.family()
    users = telemetry.QUEUE_USERS.family()
    top = telemetry.QUEUE_USER_DEPTH.family()
    rate = telemetry.DISPATCH_RATE.family()
    for model, status in latest.items():
        for b in status.queues.bands:
            depth.add_metric([model, b.band], b.queued)
            users.add_metric([model, b.band], b.backlogged_users)
            for user, queued in b.top_users:
                top.add_metric([model, b.band, user], queued)
        if status.queues.dispatch_rate is not None:
            rate.add_metric([model], status.queues.dispatch_rate)
    yield from (depth, users, top, rate)


def _demand_families(latest: dict[str, ModelStatus], now: float) -> Iterator[Metric]:
    """What scales a model's engines: every owned model has each series, 0 included, so
    that a model at zero replicas still reports the queue that should wake it."""
    oldest = telemetry.QUEUE_OLDEST_WAIT.family()
    inflight = telemetry.MODEL_INFLIGHT.family()
    demand = telemetry.MODEL_DEMAND.family()
    ready = telemetry.MODEL_READY_ENDPOINTS.family()
    for model, status in latest.items():
        for b in status.queues.bands:
            since_ms = status.oldest_ms.get(b.band)
            age = 0.0 if since_ms is None else max(0.0, now - since_ms / 1000)
            oldest.add_metric([model, b.band], round(age, 3))
        inflight.add_metric([model], sum(status.queues.inflight.values()))
        demand.add_metric([model], status.demand)
        ready.add_metric([model], sum(1 for row in status.endpoints if row.get("healthy") is True))
    yield from (oldest, inflight, demand, ready)


def _engine_families(latest: dict[str, ModelStatus]) -> Iterator[Metric]:
    gauges = {field: series.family() for field, series in _ENGINE_GAUGES}
    healthy = telemetry.ENGINE_HEALTHY.family()
    tpot = telemetry.ENGINE_TPOT.family()
    room = telemetry.ADMISSION_ROOM.family()
    for model, status in latest.items():
        for row in status.endpoints:
            url = str(row["url"])
            for f, family in gauges.items():
                if isinstance(row.get(f), int | float):
                    family.add_metric([model, url], float(row[f]))  # type: ignore[arg-type]
            healthy.add_metric([model, url], 1.0 if row.get("healthy") else 0.0)
            if isinstance(row.get("tpot_ms"), float):
                tpot.add_metric([model, url], float(row["tpot_ms"]) / 1000)  # type: ignore[arg-type]
            for band, decision in row["admission"].items():  # type: ignore[attr-defined]
                room.add_metric([model, url, band, decision["limit"]], decision["room"])
    yield from (*gauges.values(), healthy, tpot, room)


def _quota_families(quotas: list[QuotaUse]) -> Iterator[Metric]:
    """A series per limit of each configured quota: bounded by the configuration."""
    used = telemetry.QUOTA_USED.family()
    limit = telemetry.QUOTA_LIMIT.family()
    for quota in quotas:
        for use in quota.uses:
            labels = [quota.scope, quota.name, use.name]
            used.add_metric(labels, use.used)
            limit.add_metric(labels, use.limit)
    yield from (used, limit)
