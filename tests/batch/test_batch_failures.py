"""A batch step that raises never wedges its batch (issue 21): a line whose handling raises
fails that line; a step that raises every time backs off and, after
``batch.step_max_tries`` tries, fails the batch with the error, while Redis holds no
failure record of it.

The batch worker's own pieces run in this process over a real Redis: the sweep
(``batch.jobs.sweep``) enqueues the steps into RQ and an RQ ``SimpleWorker`` runs them,
as ``fairq batch-worker`` does, with a fault put into the step here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml
from redis.asyncio import Redis
from rq import Queue, SimpleWorker
from rq.registry import FailedJobRegistry

from batch import ingest as ingest_module
from batch import jobs
from broker import KeyRing, keys
from broker.batch import BatchStore, FileStore
from broker.settings import Settings
from tests.support.settings import ALICE_KEY, MODEL, make_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TRIES = 3  # with a sweep a second, the batch fails after ~1 + 2 s of backing off


def line(custom_id: str, content: str = "hi") -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    record = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
    return orjson.dumps(record | {"body": body})


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The batch steps read their settings from the environment, as in a batch worker."""
    path = tmp_path / "fairq.yaml"
    path.write_text(yaml.safe_dump(make_config(batch={"step_max_tries": TRIES})))
    monkeypatch.setenv("FAIRQ_CONFIG", str(path))
    monkeypatch.setenv("FAIRQ_REDIS_URL", redis_url)
    jobs._settings.cache_clear()
    yield jobs._settings()
    jobs._settings.cache_clear()


def submit(settings: Settings, lines: list[bytes]) -> str:
    """A batch of ``lines`` as alice's; returns its id."""

    async def blocks() -> AsyncIterator[bytes]:
        yield b"\n".join(lines) + b"\n"

    async def create() -> str:
        client = Redis.from_url(settings.require_redis_url())
        caller = KeyRing(settings).resolve(ALICE_KEY)
        file = await FileStore(client).create(
            caller.user, "in.jsonl", "batch", blocks(), keep_s=86400
        )
        batch = await BatchStore(client).create(
            caller, input_file_id=file.id, endpoint="/v1/chat/completions", window="24h",
            window_s=86400, metadata=None,
        )  # fmt: skip
        await client.aclose()
        return batch.id

    return asyncio.run(create())


def run_batch_worker(
    settings: Settings, sync: redis.Redis, batch_id: str, until: set[str], timeout_s: float
) -> dict[str, Any]:
    """Sweep and run the steps, a sweep a second, until the batch's status is in ``until``."""
    queue = Queue(keys.BATCH_QUEUE, connection=sync)
    worker = SimpleWorker([queue], connection=sync)
    deadline = time.monotonic() + timeout_s
    while True:
        jobs.sweep(sync, queue, settings)
        worker.work(burst=True, logging_level="WARNING")
        batch = {k.decode(): v.decode() for k, v in sync.hgetall(keys.batch(batch_id)).items()}
        if batch["status"] in until or time.monotonic() > deadline:
            return batch
        time.sleep(settings.batch.sweep_interval_s)


def failed_records(sync: redis.Redis) -> int:
    return FailedJobRegistry(keys.BATCH_QUEUE, connection=sync).count


def test_a_line_whose_handling_raises_fails_that_line_only(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ingest_module.estimate_cost

    def poisoned(body: dict[str, Any], model: Any) -> float:
        if "poison" in orjson.dumps(body).decode():
            raise RuntimeError("the cost estimate failed on this body")
        return real(body, model)

    monkeypatch.setattr(ingest_module, "estimate_cost", poisoned)
    batch_id = submit(settings, [line("a"), line("p", "poison"), line("b")])
    with redis.Redis.from_url(settings.require_redis_url()) as sync:
        batch = run_batch_worker(settings, sync, batch_id, {"in_progress", "failed"}, 10)
        assert batch["status"] == "in_progress" and batch["failed"] == "1"
        assert batch["queued"] == "2" and failed_records(sync) == 0
        record = orjson.loads(sync.hget(keys.batch_results(batch_id), "2")[1:])  # type: ignore[index]
    assert record["custom_id"] == "p" and record["error"]["code"] == "line_failed"
    assert "RuntimeError" in record["error"]["message"]


def test_a_step_that_always_raises_fails_the_batch_and_leaves_no_records(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> AsyncIterator[bytes]:
        raise RuntimeError("the file store is broken")

    monkeypatch.setattr(ingest_module, "read_lines", broken)
    batch_id = submit(settings, [line("a"), line("b")])
    with redis.Redis.from_url(settings.require_redis_url()) as sync:
        start = time.monotonic()
        batch = run_batch_worker(settings, sync, batch_id, {"failed"}, 20)
        took = time.monotonic() - start
        assert batch["status"] == "failed", batch
        errors = orjson.loads(batch["errors"])["data"]
        assert errors[0]["code"] == "batch_step_failed"
        assert "the file store is broken" in errors[0]["message"]
        assert len(errors[0]["message"]) <= 600
        assert 1 + 2 <= took < 15  # it backed off (1 s, then 2 s) rather than retry each sweep
        assert failed_records(sync) == 0
        footprint = _footprint(sync)
        run_batch_worker(settings, sync, batch_id, set(), 3)  # more sweeps: nothing left to do
        assert _footprint(sync) == footprint
        assert not sync.sismember(keys.ACTIVE_BATCHES, batch_id)


def _footprint(sync: redis.Redis) -> tuple[int, int]:
    """Keys in Redis and the bytes they hold (RQ's worker records left out: each burst run
    registers a worker of its own)."""
    names = [k for k in sync.scan_iter() if not k.startswith(b"rq:worker")]
    return len(names), sum(int(sync.memory_usage(k) or 0) for k in names)
