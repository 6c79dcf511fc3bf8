"""A worker holds one attempt of a job at a time, even when the job comes back to it.

park.lua takes a job back out of the engine and tells its worker on the cancel channel;
the job may be dispatched again, even to the same worker, before that worker reads the
notice. These tests drive the worker's own bookkeeping (``_spawn`` for a claim,
``_cancel_job`` for a notice) with attempts that wait on events, against the session's
real Redis: the notice of an earlier attempt must not drop the later one, and a later
claim of a job still running here replaces the earlier attempt only once it has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from redis.asyncio import Redis

from broker import Claimed
from broker.requests import RequestKind
from tests.support.eventually import aeventually
from tests.support.settings import make_settings
from workers.service import Worker

MODEL = "m"
EARLIER = Claimed(
    MODEL, b"1-0", "bQ.a1", b"{}", RequestKind.CHAT, "1", "http://e:1", "default", "u"
)
LATER = replace(EARLIER, entry_id=b"2-0")


@pytest.fixture
async def worker(aredis: Redis, redis_url: str) -> AsyncIterator[Worker]:
    settings = make_settings(redis_url, ["http://e:1"], model=MODEL)
    w = Worker(settings, aredis, aredis)
    yield w
    for task in list(w._running.values()):
        task.cancel()
    await asyncio.gather(*w._running.values(), return_exceptions=True)


async def _attempt(log: list[str], name: str, release: asyncio.Event) -> None:
    log.append(f"{name} starts")
    try:
        await release.wait()
        log.append(f"{name} ends")
    except asyncio.CancelledError:
        log.append(f"{name} dropped")
        raise


async def test_a_notice_for_an_earlier_attempt_leaves_the_later_one_running(
    worker: Worker,
) -> None:
    log: list[str] = []
    release = asyncio.Event()
    worker._spawn(LATER, _attempt(log, "later", release))
    await aeventually(lambda: log == ["later starts"], "the attempt started", 2)
    await worker._cancel_job(f"{LATER.job_id} {EARLIER.entry_id.decode()}")  # stale
    await asyncio.sleep(0.05)
    assert log == ["later starts"] and LATER.job_id in worker.running
    await worker._cancel_job(f"{LATER.job_id} {LATER.entry_id.decode()}")  # its own
    await aeventually(lambda: LATER.job_id not in worker.running, "the attempt dropped", 2)
    assert log == ["later starts", "later dropped"]


async def test_a_job_claimed_again_replaces_its_earlier_attempt_once_that_has_ended(
    worker: Worker,
) -> None:
    log: list[str] = []
    release = asyncio.Event()
    worker._spawn(EARLIER, _attempt(log, "earlier", release))
    await aeventually(lambda: log == ["earlier starts"], "the earlier attempt started", 2)
    worker._spawn(LATER, _attempt(log, "later", release))
    await aeventually(lambda: len(log) == 3, "the later attempt started", 2)
    assert log == ["earlier starts", "earlier dropped", "later starts"]
    # The earlier attempt's end did not release the job: the later one holds it.
    assert worker.running == {LATER.job_id} and worker._jobs[LATER.job_id] is LATER
    assert LATER.job_id not in worker._dropped  # the earlier attempt's mark is gone
    release.set()
    await aeventually(lambda: not worker.running, "the later attempt ended", 2)
    assert log[-1] == "later ends"
