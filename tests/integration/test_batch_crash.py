"""A batch worker SIGKILLed during ingest and during finalize: after a restart the batch
completes with every line exactly once in its files, and every valid line ran once at
the engine. Real processes, a real Redis; the batch worker is a subprocess of the test."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
import redis
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from broker import keys
from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.processes import ProcessGroups
from tests.support.stack import demo_stack, sim_port

pytestmark = pytest.mark.integration

MODEL = DEMO_MODELS[0]
VALID, INVALID = 60, 9_000  # invalid lines are cheap to run and make finalize long
_DEADLINE_S = 90


@pytest.fixture
def stack(redis_url: str) -> Iterator[Stack]:
    env = {"FAIRQ_BATCH__LEASE_S": "2", "FAIRQ_BATCH__INGEST_CHUNK_LINES": "200"}
    with demo_stack(redis_url=redis_url, batch_workers=0, env=env) as running:
        yield running


def start_batch_worker(stack: Stack, processes: ProcessGroups) -> subprocess.Popen[bytes]:
    """A batch worker in a process group of its own, killed whole when the test ends."""
    worker: subprocess.Popen[bytes] = processes.start(
        [sys.executable, "-m", "fairq", "batch-worker"], env=stack.env
    )
    return worker


def kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def engine_requests(stack: Stack) -> float:
    text = local_http.get(f"http://127.0.0.1:{sim_port(stack, MODEL)}/metrics").text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "vllm:request_success_total"
    )


def batch_file() -> tuple[bytes, list[str]]:
    lines, ids = [], []
    for i in range(VALID + INVALID):
        custom_id = f"line-{i}"
        model = MODEL if i % (INVALID // VALID + 1) == 0 else "no-such-model"
        body = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        lines.append(
            orjson.dumps(
                {
                    "custom_id": custom_id,
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
        )
        ids.append(custom_id)
    return b"\n".join(lines), ids


def until_batch(r: redis.Redis, batch_id: str, done: Callable[[Any], object], what: str) -> None:
    """Until the batch's hash is ``done``; polled each millisecond, for a kill to land in time."""
    eventually(
        lambda: r.hgetall(keys.batch(batch_id)),
        f"batch {batch_id}: {what}",
        _DEADLINE_S,
        until=done,
        interval_s=0.001,
    )


def test_a_batch_worker_killed_in_ingest_and_in_finalize_loses_and_repeats_nothing(
    stack: Stack, redis_url: str, processes: ProcessGroups
) -> None:
    client = OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="fq-demo-alice", max_retries=0)
    r = redis.Redis.from_url(redis_url)
    data, ids = batch_file()
    valid = sum(1 for i in range(len(ids)) if i % (INVALID // VALID + 1) == 0)
    before = engine_requests(stack)
    uploaded = client.files.create(file=("crash.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )

    worker = start_batch_worker(stack, processes)
    until_batch(r, batch.id, lambda h: int(h.get(b"line", 0)) >= 2_000, "2,000 lines read")
    kill(worker)
    status = r.hget(keys.batch(batch.id), "status")
    assert status == b"validating", "the kill was meant to land during ingest"

    worker = start_batch_worker(stack, processes)
    until_batch(r, batch.id, lambda h: h.get(b"status") == b"finalizing", "finalizing")
    kill(worker)
    assert r.hget(keys.batch(batch.id), "status") == b"finalizing", "meant to land in finalize"

    worker = start_batch_worker(stack, processes)
    try:
        until_batch(r, batch.id, lambda h: h.get(b"status") == b"completed", "completed")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(10)
    done = client.batches.retrieve(batch.id)
    assert done.request_counts is not None
    assert (
        done.request_counts.total,
        done.request_counts.completed,
        done.request_counts.failed,
    ) == (len(ids), valid, len(ids) - valid)
    seen = [
        orjson.loads(x)["custom_id"]
        for file_id in (done.output_file_id, done.error_file_id)
        if file_id
        for x in client.files.content(file_id).content.splitlines()
    ]
    assert len(seen) == len(ids) and sorted(seen) == sorted(ids)  # each exactly once
    assert engine_requests(stack) - before == valid  # no line ran twice
