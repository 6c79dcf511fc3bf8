"""fairq's Prometheus series: every name, label and bucket in one place.

Each component exports what it alone knows; Prometheus joins them by name:

    gateway     jobs submitted (queued, or sent express: those skip the dispatcher) and
                refused; jobs it ended (cancelled, expired)
    dispatcher  queue depth and backlogged users per model and band (read from Redis on
                a timer, never per scrape), per-user depth for the top N users only,
                dispatches, admission refusals by reason, the engines as
                its scraper last saw them, the admission room per endpoint and band; each
                configured quota's use and limit (read on the same timer; every
                dispatcher replica exports the same values: aggregate with max, not sum)
    worker      jobs running, jobs ended by state, queue wait and time to first token;
                reclaims, dead letters, engine retries, expired jobs, resumed answers
    batch       requests of batches by state (``batch_request_ended``; see below)
    keda scaler the activity it pushed to KEDA per model (``scaler``)

Counters and histograms are registered here; the gauges a collector builds at scrape
time from a component's latest view (``dispatcher.publisher``, ``workers.telemetry``) are
declared here as ``Gauge`` (name, help, labels) and built by ``Gauge.family``.

Observations on the hot path are a counter increment or one histogram observe per
job, never per token. Labels are bounded: model, band, endpoint and state come from
the configuration or enums; a user appears only in the top-N gauge, whose series
are rebuilt on every collection (a user who left the top N leaves the output).

The dispatcher, the worker, the batch worker and the KEDA scaler serve ``/metrics`` on a
port of their own (``serve_metrics``: loopback unless ``metrics_host`` says otherwise, a
port per kind of component unless ``metrics_port`` says one, 0: none); the gateway serves
it on its HTTP port, or on ``http.metrics_port`` where that is set (``serve_metrics_at``).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from broker.settings import Settings

log = logging.getLogger(__name__)

# Seconds; queue waits span milliseconds (an idle model) to many minutes (a flood).
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)

JOBS_SUBMITTED = Counter(
    "fairq_jobs_submitted", "Jobs accepted, by how they went on", ["model", "band", "route"]
)  # route: queued (to the user's queue) | express (straight to an endpoint)
JOBS_REFUSED = Counter(
    "fairq_jobs_refused", "Submissions refused before queueing", ["model", "band", "reason"]
)
JOBS_ENDED = Counter(
    "fairq_jobs_ended", "Jobs that reached a terminal state, by state", ["model", "band", "state"]
)
DISPATCHED = Counter("fairq_dispatched", "Jobs moved to a ready stream", ["model", "band"])
ADMISSION_REFUSALS = Counter(
    "fairq_admission_refusals",
    "Dispatch rounds that found an endpoint full while jobs waited, by reason",
    ["model", "band", "reason"],
)  # reason: dispatcher.admission.Limit (queue_target, tpot_ceiling, stale_metrics, ...)
PREEMPTIONS = Counter(
    "fairq_preemptions",
    "Jobs taken back out of an engine (no output yet) so a newcomer got their batch slot",
    ["model"],
)
QUEUE_WAIT = Histogram(
    "fairq_queue_wait_seconds",
    "From enqueue to dispatch, observed when the job ends",
    ["model", "band"],
    buckets=_WAIT_BUCKETS,
)
TTFT = Histogram(
    "fairq_ttft_seconds",
    "From enqueue to the first token of a streamed job",
    ["model", "band"],
    buckets=_TTFT_BUCKETS,
)
# Batch API progress: the batch worker calls ``batch_request_ended`` once per request of
# a batch file as its job ends, and ``batch_ended`` once per batch.
BATCH_REQUESTS = Counter(
    "fairq_batch_requests", "Requests of batches that ended, by state", ["model", "state"]
)
BATCHES = Counter("fairq_batches_ended", "Batches that ended, by status", ["status"])
# The worker's guarantees. Labels are enums only (the reclaim decision), never ids or
# users: the detail of a job travels in its error, not in a metric.
DEAD_LETTERS = Counter(
    "fairq_worker_dead_letters_total",
    "Jobs ended as dead letters: started job_max_attempts times, each time losing its worker",
)
RECLAIMS = Counter(
    "fairq_worker_reclaims_total",
    "Ready entries taken over from a dead worker, by what became of the job",
    ["decision"],
)
ENGINE_RETRIES = Counter(
    "fairq_worker_engine_retries_total",
    "Engine calls made again after a failure before the job's first output",
)
EXPIRED = Counter(
    "fairq_worker_expired_total",
    "Queued jobs ended as expired (past their band's deadline or their own)",
)
REROUTES = Counter(
    "fairq_worker_reroutes_total",
    "Jobs handed back for another endpoint because their engine never took them, by what "
    "became of them (rerouted; exhausted: failed past engine_max_reroutes)",
    ["outcome"],
)
RESUMES = Counter(
    "fairq_worker_resumes_total",
    "Answers taken back mid-way that went on: from token ids (exact) or from their text",
    ["how"],
)
# The KEDA external scaler (scaler): what it told KEDA's StreamIsActive calls.
KEDA_PUSHES = Counter(
    "fairq_keda_pushes", "Activity sent to KEDA's open streams, by model", ["model", "active"]
)


@dataclass(frozen=True)
class Gauge:
    """A gauge that a collector builds at scrape time from a component's latest view."""

    name: str
    help: str
    labels: tuple[str, ...] = ()

    def family(self, value: float | None = None) -> GaugeMetricFamily:
        """An empty family to add labelled samples to, or one unlabelled ``value``."""
        if value is not None:
            return GaugeMetricFamily(self.name, self.help, value=value)
        return GaugeMetricFamily(self.name, self.help, labels=list(self.labels))


# The dispatcher's view (dispatcher.publisher.DispatcherCollector).
_ENDPOINT = ("model", "endpoint")
QUEUE_DEPTH = Gauge("fairq_queue_depth", "Jobs queued", ("model", "band"))
QUEUE_USERS = Gauge("fairq_queue_backlogged_users", "Users with queued jobs", ("model", "band"))
QUEUE_USER_DEPTH = Gauge(
    "fairq_queue_user_depth",
    "Jobs queued by the users with the most (top status_top_users per band)",
    ("model", "band", "user"),
)
DISPATCH_RATE = Gauge(
    "fairq_dispatch_rate", "Jobs dispatched per second, recent window", ("model",)
)
# A model's demand, what its engines' autoscaler reads (docs/operations.md, "Scale to zero").
QUEUE_OLDEST_WAIT = Gauge(
    "fairq_queue_oldest_wait_seconds",
    "Age of the oldest queued job (among the band's first 200 users in fairness order)",
    ("model", "band"),
)
MODEL_INFLIGHT = Gauge(
    "fairq_model_inflight", "fairq jobs dispatched to the model's engines, not ended", ("model",)
)
MODEL_DEMAND = Gauge(
    "fairq_model_demand", "Jobs queued in every band plus jobs in flight", ("model",)
)
MODEL_READY_ENDPOINTS = Gauge(
    "fairq_model_ready_endpoints", "Engine endpoints of the model that are healthy", ("model",)
)
ENGINE_WAITING = Gauge(
    "fairq_engine_waiting", "Requests waiting in the engine at the last scrape", _ENDPOINT
)
ENGINE_RUNNING = Gauge(
    "fairq_engine_running", "Requests running in the engine at the last scrape", _ENDPOINT
)
ENGINE_KV_USAGE = Gauge(
    "fairq_engine_kv_cache_usage", "Engine KV-cache usage (0..1), last scrape", _ENDPOINT
)
ENGINE_METRICS_AGE = Gauge(
    "fairq_engine_metrics_age_seconds", "Age of the engine's last good scrape", _ENDPOINT
)
ENGINE_INFLIGHT = Gauge(
    "fairq_engine_inflight", "fairq jobs dispatched to the endpoint, not ended", _ENDPOINT
)
ENGINE_QUEUE_ESTIMATE = Gauge(
    "fairq_engine_queue_estimate", "Admission's estimate of the engine queue", _ENDPOINT
)
ENGINE_HEALTHY = Gauge("fairq_engine_healthy", "1: scrapes succeed", _ENDPOINT)
ENGINE_TPOT = Gauge(
    "fairq_engine_tpot_seconds", "Recent time per output token of the engine", _ENDPOINT
)
ADMISSION_ROOM = Gauge(
    "fairq_admission_room",
    "Jobs admission would send the endpoint now, by band and the limit that binds",
    ("model", "endpoint", "band", "limit"),
)
_QUOTA = ("scope", "name", "limit")  # tenant | user, its name, tokens_per_minute | ...
QUOTA_USED = Gauge(
    "fairq_quota_used", "Tokens or requests a quota's current window has used", _QUOTA
)
QUOTA_LIMIT = Gauge("fairq_quota_limit", "A quota's limit (tokens or requests)", _QUOTA)
# The worker's table (workers.telemetry.WorkerCollector).
WORKER_RUNNING = Gauge("fairq_worker_jobs_running", "Jobs this worker runs now", ("model",))
WORKER_CONCURRENCY = Gauge("fairq_worker_concurrency", "Jobs this worker runs at most")


def refused(model: str, band: str, limits: Mapping[str, str]) -> None:
    """A dispatch round found no room: count each full endpoint's reason once."""
    for reason in limits.values():
        ADMISSION_REFUSALS.labels(model, band, reason).inc()


def batch_request_ended(model: str, state: str) -> None:
    BATCH_REQUESTS.labels(model, state).inc()


def batch_ended(status: str) -> None:
    BATCHES.labels(status).inc()


# Each component's /metrics port when ``metrics_port`` is not set: one of each on a host
# does not collide, and Prometheus finds each where it expects it.
METRICS_PORTS = {"dispatcher": 9464, "worker": 9465, "batch worker": 9466, "keda scaler": 9468}


def serve_metrics(settings: Settings, component: str) -> int | None:
    """Serve the default registry on ``metrics_host`` from a daemon thread; returns the port.

    ``metrics_port`` unset: the component's own port (``METRICS_PORTS``), or, when another
    process on the host holds it (a second worker), a free port, logged: a second worker
    on a host still has its metrics. Set: that port. 0: no server (None). Metrics are not
    worth stopping a component for, so a failure to bind is logged, not raised (None).
    """
    host, port = settings.metrics_host, settings.metrics_port
    if port == 0:
        return None
    wanted = METRICS_PORTS[component] if port is None else port
    try:
        bound = _start_http_server(host, wanted)
    except OSError as exc:
        if port is None and exc.errno == errno.EADDRINUSE:
            return _serve_on_a_free_port(host, wanted, component)
        log.error("cannot serve /metrics on %s:%d (%s); running without metrics", host, wanted, exc)
        return None
    log.info("serving /metrics on %s:%d", host, bound)
    return bound


def serve_metrics_at(host: str, port: int) -> int | None:
    """Serve the default registry on ``host:port`` from a daemon thread (the gateway's own
    port: ``http.metrics_port``); returns the port, or None where it cannot bind (logged,
    as ``serve_metrics``)."""
    try:
        bound = _start_http_server(host, port)
    except OSError as exc:
        log.error("cannot serve /metrics on %s:%d (%s); running without metrics", host, port, exc)
        return None
    log.info("serving /metrics on %s:%d", host, bound)
    return bound


def _serve_on_a_free_port(host: str, taken: int, component: str) -> int | None:
    try:
        bound = _start_http_server(host, 0)
    except OSError as exc:
        log.error("cannot serve /metrics on %s (%s); running without metrics", host, exc)
        return None
    log.warning(
        "serving /metrics on %s:%d: the %s's own port %d is taken on this host (another "
        "%s?); set metrics_port (FAIRQ_METRICS_PORT) to choose one",
        host,
        bound,
        component,
        taken,
        component,
    )
    return bound


def _start_http_server(host: str, port: int) -> int:
    server, _ = start_http_server(port, host)
    return int(server.server_port)
