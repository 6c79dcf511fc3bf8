"""A batch worker's teardown is quick: RQ's pubsub thread stops when the worker does.

RQ's ``Worker.unsubscribe`` unsubscribes, then calls ``PubSubWorkerThread.stop()``
and joins the thread for at most a second. redis-py 8.2's ``stop()`` joins the thread
itself, without a timeout, while the thread, having seen its subscription end, waits up
to RQ's ``sleep_time`` (60 s) for a new one: every burst of
``tests/batch/test_batch_failures.py`` and every ``fairq batch-worker`` shutdown then
took up to a minute (past Kubernetes' grace period). pyproject.toml keeps redis below
8.2 for it; this test is what a newer release has to pass first.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from rq import Queue, SimpleWorker

pytestmark = pytest.mark.integration

_TRIES = 6  # the hang is a race: one teardown in three or so met it on redis 8.2
_QUICK_S = 5.0


def test_a_workers_unsubscribe_returns_at_once(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as sync:
        worker = SimpleWorker([Queue("teardown-test", connection=sync)], connection=sync)
        for attempt in range(_TRIES):
            worker.subscribe()
            time.sleep(0.05)  # the thread is in its wait for messages
            done = threading.Thread(target=worker.unsubscribe, daemon=True)
            start = time.monotonic()
            done.start()
            done.join(_QUICK_S)
            took = time.monotonic() - start
            assert not done.is_alive(), (
                f"teardown {attempt + 1}: unsubscribe still running after {took:.1f} s "
                "(redis-py's PubSubWorkerThread.stop() waiting out rq's sleep_time?)"
            )
