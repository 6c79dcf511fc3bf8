"""The batch worker: an RQ worker on queue ``fairq-batch`` that also sweeps and schedules
(``fairq.services.run_batch_worker`` runs it).

It is RQ's ``SimpleWorker`` (a job runs in the worker process itself, not in a
forked child), so a SIGKILL stops the job with the worker, and the step is taken
up again by the next sweep once its lease runs out. RQ's maintenance hook runs
every ``batch.sweep_interval_s`` (the blocking dequeue times out that often);
besides RQ's own registry cleaning it moves due scheduled jobs (the expire
jobs) to the queue, in-process, and sweeps the active batches (``jobs.sweep``).
Any number of batch workers may run: leases keep one step per batch at a time.
"""

from __future__ import annotations

from redis import Redis as SyncRedis
from rq import Queue, SimpleWorker
from rq.scheduler import RQScheduler

from batch.jobs import sweep
from broker import keys
from broker.settings import Settings

# RQ's dequeue blocks for worker_ttl - 15 s: this makes it block for the sweep interval.
_RQ_TTL_MARGIN_S = 15


class BatchWorker(SimpleWorker):
    def __init__(self, settings: Settings, connection: SyncRedis) -> None:
        interval = settings.batch.sweep_interval_s
        queue = Queue(keys.BATCH_QUEUE, connection=connection)
        super().__init__(
            [queue],
            connection=connection,
            worker_ttl=_RQ_TTL_MARGIN_S + interval,
            maintenance_interval=interval,
        )
        self._settings = settings
        self._queue = queue
        self._scheduler = RQScheduler([queue], connection=connection, interval=interval)

    def run_maintenance_tasks(self) -> None:
        # rq leaves it unannotated; through super(), pyproject's untyped_calls_exclude
        # does not reach it.
        super().run_maintenance_tasks()  # type: ignore[no-untyped-call]
        if self._scheduler.acquire_locks():
            self._scheduler.enqueue_scheduled_jobs()
        sweep(self.connection, self._queue, self._settings)
