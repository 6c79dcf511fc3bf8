"""The worker's guarantee metrics, in the default registry that ``broker.telemetry``
serves on ``metrics_port`` with the rest of the worker's series.

Labels are enums only (the reclaim decision, how a resumed answer went on), never ids or
users: the detail of a job travels in its error, not in a metric.
"""

from __future__ import annotations

from prometheus_client import Counter

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
    "fairq_worker_expired_total", "Queued jobs ended as expired (past their band's deadline)"
)
RESUMES = Counter(
    "fairq_worker_resumes_total",
    "Answers taken back mid-way that went on: from token ids (exact) or from their text",
    ["how"],
)
