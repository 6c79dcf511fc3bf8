"""The worker's Prometheus series: jobs running, jobs ended, queue wait, time to first token.

On the hot path a job costs one counter increment and one list append when it
ends (``ended``), nothing per token. The job's times live in its Redis hash
(enqueued ``tq``, dispatched ``td``, first token ``tf``, ended ``te``, and ``nw`` for
a newcomer); a background task reads the hashes of the jobs that ended since its last
round in one pipeline, observes the histograms, and appends each job's latencies to
the model's latency stream in the next round trip. That stream is the dashboard's chart
and newcomer TTFT, and the model's drain for queued jobs' wait estimates
(``broker.position``: its time in the engine, ``te - td``). Jobs running per model are
counted at scrape time from the worker's own table (job ids embed the model).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import Claimed, Latency, Outcome, add_latency, keys, telemetry
from broker import job_fields as jf
from broker.jobs import model_of

log = logging.getLogger(__name__)

_MAX_PENDING = 10_000  # ended jobs awaiting their timings; beyond, the oldest are skipped


@dataclass(frozen=True, slots=True)
class _Ended:
    model: str
    job_id: str
    band: str
    first_seen: bool  # its first token was seen as it came (not one body at its end)


class WorkerTelemetry:
    def __init__(self, interval_s: float = 1.0) -> None:
        self._interval_s = interval_s
        self._ended: list[_Ended] = []

    def ended(self, job: Claimed, outcome: Outcome) -> None:
        """This worker ended the job (complete.lua said so): count it, time it later."""
        telemetry.JOBS_ENDED.labels(job.model, job.band, outcome.state.value).inc()
        if len(self._ended) < _MAX_PENDING:
            first_seen = job.stream_flag.from_engine
            self._ended.append(_Ended(job.model, job.job_id, job.band, first_seen))

    async def observe(self, redis: Redis) -> int:
        """Time the jobs ended since the last call; returns how many were observed."""
        batch, self._ended = self._ended, []
        if not batch:
            return 0
        async with redis.pipeline(transaction=False) as pipe:
            for e in batch:
                pipe.hmget(keys.job(e.model, e.job_id), *_TIMES)
            times = await pipe.execute()
        async with redis.pipeline(transaction=False) as pipe:
            for e, fields in zip(batch, times, strict=True):
                latency = _latency(e, fields)
                if latency is not None:
                    add_latency(pipe, e.model, latency)
            await pipe.execute()
        return len(batch)

    async def loop(self, redis: Redis) -> None:
        """Observe every ``interval_s`` until cancelled; Redis errors are logged, not raised."""
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.observe(redis)
            except RedisError as exc:
                log.warning("job timings not read (%s); their latencies are skipped", exc)


# The job hash's fields ``_latency`` takes.
_TIMES = (jf.QUEUED_MS, jf.DISPATCHED_MS, jf.FIRST_TOKEN_MS, jf.ENDED_MS, jf.NEWCOMER)


def _latency(e: _Ended, fields: Sequence[bytes | None]) -> Latency | None:
    tq, td, tf, te, nw = fields
    if not tq:
        return None  # the hash expired already
    enqueued = int(tq)
    wait_ms = int(td) - enqueued if td else None
    run_ms = max(0, int(te) - int(td)) if td and te else None
    ttft_ms = int(tf) - enqueued if e.first_seen and tf else None
    labels = (e.model, e.band)
    if wait_ms is not None:
        telemetry.QUEUE_WAIT.labels(*labels).observe(max(0, wait_ms) / 1000)
    if ttft_ms is not None:
        telemetry.TTFT.labels(*labels).observe(max(0, ttft_ms) / 1000)
    return Latency(e.band, wait_ms, ttft_ms, run_ms, newcomer=nw == b"1")


class WorkerCollector(Collector):
    """Jobs running now, per model, counted from the worker's table at scrape time."""

    def __init__(
        self, models: Sequence[str], running: Callable[[], Collection[str]], concurrency: int
    ) -> None:
        self._models = models
        self._running = running
        self._concurrency = concurrency

    def collect(self) -> Iterator[Metric]:
        counts = Counter(model_of(job_id) for job_id in list(self._running()))
        running = telemetry.WORKER_RUNNING.family()
        for model in self._models:
            running.add_metric([model], counts.get(model, 0))
        yield running
        yield telemetry.WORKER_CONCURRENCY.family(value=self._concurrency)
