"""A Redis that holds files from before files expired (keys without a TTL, no quota): a
batch worker that starts gives each an end and counts it against its owner's quota, so
an upgraded deployment's Redis does not keep them for ever."""

from __future__ import annotations

import time

import pytest
import redis

from broker import keys
from tests.support.eventually import eventually
from tests.support.settings import make_config
from tests.support.stack import WorkerProcesses

pytestmark = pytest.mark.integration


def test_a_starting_batch_worker_ends_the_files_kept_forever(redis_url: str) -> None:
    file_id, created_at = "file-from-before", int(time.time()) - 60
    with redis.Redis.from_url(redis_url) as r:
        r.hset(
            keys.file_meta(file_id),
            mapping={"owner": "alice", "bytes": 5, "created_at": created_at,
                     "filename": "old.jsonl", "purpose": "batch"},
        )  # fmt: skip
        r.set(keys.file_data(file_id), b"hello")
        r.zadd(keys.owner_files("alice"), {file_id: created_at * 1_000_000})
        assert r.ttl(keys.file_data(file_id)) == -1  # kept for ever
        # An engine that is never called: the batch worker only queues lines for the workers
        procs = WorkerProcesses(make_config(["http://127.0.0.1:9"], quick=True), redis_url)
        try:
            procs.spawn_batch_worker()

            def ended() -> bool:
                return r.hget(keys.file_meta(file_id), "expires_at") is not None

            eventually(ended, "the batch worker to give the file an end", 30)
        finally:
            procs.close()
        expires_at = int(r.hget(keys.file_meta(file_id), "expires_at") or 0)
        assert expires_at > time.time() + 3000  # the default keep, and at least an hour
        assert r.expiretime(keys.file_data(file_id)) == expires_at
        assert r.expiretime(keys.file_meta(file_id)) == expires_at
        assert int(r.hget(keys.owner_files_held("alice"), "*") or 0) == 5
