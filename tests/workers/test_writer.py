"""The worker's result writer: when it flushes, and what lands in the result stream.

Against the session's real Redis. The linger here is long (30 s), so "it did not
flush yet" and "it flushed without lingering" cannot be a matter of timing: the
waits asserted on are a hundred times shorter.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from redis.asyncio import Redis

from broker import Claimed, ExecutionStore, Outcome, TokenTrail, WrittenEntry, keys
from broker import job_fields as jf
from broker.jobs import JobState
from broker.requests import RequestKind
from tests.support.eventually import aeventually
from tests.support.settings import make_settings
from workers.writer import ResultWriter

MODEL = "m"
LONG_MS = 30_000.0


def _job(n: int) -> Claimed:
    return Claimed(
        MODEL, b"1-0", f"bQ.w{n}", b"{}", RequestKind.CHAT, "1", "http://e:1", "default", "u"
    )


@pytest.fixture
async def writer(aredis: Redis, redis_url: str) -> AsyncIterator[ResultWriter]:
    settings = make_settings(redis_url, ["http://e:1"], model=MODEL)
    store = ExecutionStore(aredis, settings)
    await store.load_scripts()
    w = ResultWriter(store, LONG_MS)
    task = asyncio.create_task(w.run())
    yield w
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _flushes_reach(w: ResultWriter, n: int) -> None:
    await aeventually(lambda: w.flushes >= n, f"{n} flushes", 5, interval_s=0.005)


async def _chunks(redis: Redis, job: Claimed) -> list[bytes]:
    entries = await redis.xrange(keys.results(MODEL, job.job_id))
    return [fields[b"d"] for _, fields in entries if b"d" in fields]


async def _two_streaming(writer: ResultWriter) -> tuple[Claimed, Claimed]:
    """Two jobs whose first chunks ("a", "x") are written: from now on the writer lingers."""
    first, second = _job(1), _job(2)
    writer.chunk(first, b"data: a\n\n", first=True)
    writer.chunk(second, b"data: x\n\n", first=True)
    await _flushes_reach(writer, 1)
    return first, second


async def test_a_job_streaming_alone_is_written_without_lingering(
    writer: ResultWriter, aredis: Redis
) -> None:
    job = _job(1)
    writer.chunk(job, b"data: 1\n\n", first=True)
    await _flushes_reach(writer, 1)
    writer.chunk(job, b"data: 2\n\n")  # nothing to share a write with: no 30 s wait
    await _flushes_reach(writer, 2)
    assert await _chunks(aredis, job) == [b"data: 1\n\n", b"data: 2\n\n"]


async def test_while_others_stream_chunks_linger_and_share_one_write(
    writer: ResultWriter, aredis: Redis
) -> None:
    first, second = await _two_streaming(writer)
    writer.chunk(first, b"data: b\n\n")
    writer.chunk(second, b"data: y\n\n")
    writer.chunk(first, b"data: c\n\n")
    await asyncio.sleep(0.3)
    assert writer.flushes == 1  # lingering: buffered, not written
    assert await _chunks(aredis, first) == [b"data: a\n\n"]
    writer.mark_started(second)  # urgent: the write goes now, with everything buffered
    await _flushes_reach(writer, 2)
    assert await _chunks(aredis, first) == [b"data: a\n\n", b"data: b\n\ndata: c\n\n"]
    assert await _chunks(aredis, second) == [b"data: x\n\n", b"data: y\n\n"]


async def test_an_end_is_written_at_once_after_its_jobs_last_chunks(
    writer: ResultWriter, aredis: Redis
) -> None:
    job, _ = await _two_streaming(writer)
    writer.chunk(job, b"data: b\n\n")  # lingers (another job streams) until the end comes
    # The job is not in Redis (never queued): complete.lua ends nothing and says so.
    ended = await asyncio.wait_for(writer.finish(job, Outcome(JobState.COMPLETED)), 5)
    assert ended is False
    assert writer.flushes == 2
    assert await _chunks(aredis, job) == [b"data: a\n\n", b"data: b\n\n"]


async def test_the_token_ids_of_chunks_that_share_a_write_stay_in_their_order(
    writer: ResultWriter, aredis: Redis
) -> None:
    first, second = await _two_streaming(writer)
    writer.chunk(first, b"data: b\n\n", trail=TokenTrail(b"7"))
    writer.chunk(first, b"data: u\n\n")  # the usage chunk: no ids
    writer.chunk(first, b"data: c\n\n", trail=TokenTrail(b"8,9"))
    writer.mark_started(second)
    await _flushes_reach(writer, 2)
    x = ExecutionStore(aredis, make_settings("redis://unused", models=[]))
    resumed = replace(first, resume_gen=1)  # what a resumed attempt reads back
    assert await x.written(resumed) == [
        WrittenEntry(b"data: a\n\n"),
        WrittenEntry(b"data: b\n\ndata: u\n\ndata: c\n\n", TokenTrail(b"7;8,9")),
    ]


async def test_a_resumed_attempt_writes_after_the_fence_of_its_generation(
    writer: ResultWriter, aredis: Redis
) -> None:
    job = replace(_job(1), resume_gen=2)  # park.lua fenced everything before with 2-0
    writer.chunk(job, b"data: a\n\n", first=True)
    await _flushes_reach(writer, 1)
    writer.chunk(job, b"data: b\n\n")
    await _flushes_reach(writer, 2)
    entries = await aredis.xrange(keys.results(MODEL, job.job_id))
    # 2-1 is left to start.lua's acceptance mark (none here: this test runs no start).
    assert [entry_id for entry_id, _ in entries] == [b"2-2", b"2-3"]


async def test_a_first_chunk_records_the_workers_first_output_time_on_the_running_job(
    writer: ResultWriter, aredis: Redis
) -> None:
    job = _job(1)
    record = keys.job(MODEL, job.job_id)
    await aredis.hset(record, jf.STATE, JobState.RUNNING.value)
    writer.chunk(job, b"data: a\n\n", first_ms=1_234)
    await _flushes_reach(writer, 1)  # flushed without lingering, as a first chunk
    writer.chunk(job, b"data: b\n\n")
    await _flushes_reach(writer, 2)
    assert await aredis.hget(record, jf.FIRST_TOKEN_MS) == b"1234"
