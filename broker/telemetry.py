"""fairq's Prometheus series: every name, label and bucket in one place.

Each component exports what it alone knows; Prometheus joins them by name:

    gateway     jobs submitted (queued, or sent express: those skip the dispatcher) and
                refused; jobs it ended (cancelled, expired)
    dispatcher  queue depth and backlogged users per model and band (read from Redis on
                a timer, never per scrape), per-user depth for the top N users only,
                dispatches, admission refusals by reason, the engines as
                its scraper last saw them, the admission room per endpoint and band
    worker      jobs running, jobs ended by state, queue wait and time to first token
    batch       requests of batches by state (``batch_request_ended``; see below)

Observations on the hot path are a counter increment or one histogram observe per
job, never per token. Labels are bounded: model, band, endpoint and state come from
the configuration or enums; a user appears only in the top-N gauge, whose series
are rebuilt on every collection (a user who left the top N leaves the output).

The dispatcher and the worker serve ``/metrics`` on their own port
(``metrics_port``, 0: none); the gateway serves it on its HTTP port.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from prometheus_client import Counter, Histogram, start_http_server

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


def refused(model: str, band: str, limits: Mapping[str, str]) -> None:
    """A dispatch round found no room: count each full endpoint's reason once."""
    for reason in limits.values():
        ADMISSION_REFUSALS.labels(model, band, reason).inc()


def batch_request_ended(model: str, state: str) -> None:
    BATCH_REQUESTS.labels(model, state).inc()


def batch_ended(status: str) -> None:
    BATCHES.labels(status).inc()


def serve_metrics(settings: Settings) -> int | None:
    """Serve the default registry on ``metrics_host:metrics_port`` from a daemon thread.

    Returns the port, or None when it is 0 (off) or taken: metrics are not worth
    stopping a dispatcher or worker for, so a failure to bind is logged, not raised.
    """
    if settings.metrics_port == 0:
        return None
    try:
        start_http_server(settings.metrics_port, settings.metrics_host)
    except OSError as exc:
        log.error(
            "cannot serve /metrics on %s:%d (%s); running without metrics",
            settings.metrics_host,
            settings.metrics_port,
            exc,
        )
        return None
    log.info("serving /metrics on %s:%d", settings.metrics_host, settings.metrics_port)
    return settings.metrics_port
