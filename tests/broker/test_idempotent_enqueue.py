"""A submission with an Idempotency-Key makes its job once: the key's claim, then
enqueue.lua, which makes the job and its record in one call (``broker.idempotency``).
A real Redis, over both ways a job is queued (the gateway's lean connection, redis-py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from redis.asyncio import Redis

from broker import DispatchStore, Grant, JobQueue, JobState, Settings, keys
from broker.errors import IdempotencyKeyReused, QueueFull
from broker.idempotency import Idempotency, bind, fingerprint
from broker.jobs import Submission, new_job_id
from broker.queue import Submitted
from broker.redis.resp import RespLink
from tests.support.contract import EP, submission
from tests.support.settings import MODEL, make_settings

OTHER = "m2"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def settings(redis_url: str) -> Settings:
    models = [{"name": name, "endpoints": ["http://127.0.0.1:9"]} for name in (MODEL, OTHER)]
    return make_settings(redis_url, models=models, max_queued_per_user=2, idempotency_window_s=120)


@pytest.fixture(params=["lean link", "redis-py"])
async def queue(
    request: pytest.FixtureRequest, aredis: Redis, settings: Settings
) -> AsyncIterator[JobQueue]:
    link = RespLink(settings.require_redis_url()) if request.param == "lean link" else None
    yield JobQueue(aredis, settings, link)
    if link is not None:
        link.close()


def keyed(
    key: str = "key-1",
    body: object = BODY,
    *,
    model: str = MODEL,
    owner: str = "alice",
    route: str = "chat",
) -> Submission:
    """A new try of a request: its own job id, as the gateway makes one per request."""
    once = Idempotency.of(
        key, owner=owner, route=route, fingerprint=fingerprint(route, body), window_s=120
    )
    sub = submission(owner)
    return replace(sub, model=model, job_id=new_job_id(model), once=once)


async def jobs(redis: Redis, model: str = MODEL) -> list[bytes]:
    return [key async for key in redis.scan_iter(match=keys.job_pattern(model))]


async def test_a_retry_gets_the_first_tries_job_and_makes_no_second(
    queue: JobQueue, aredis: Redis
) -> None:
    first = await queue.submit_once(keyed())
    again = await queue.submit_once(keyed())
    assert not first.replayed and again.replayed and again.job_id == first.job_id
    assert await jobs(aredis) == [keys.job(MODEL, first.job_id).encode()]
    record = keyed().once
    assert record is not None
    stored = await aredis.hgetall(record.job_record(MODEL))
    assert stored == {b"f": record.fingerprint.encode(), b"j": first.job_id.encode()}
    assert 115 <= await aredis.ttl(record.job_record(MODEL)) <= 120  # the window


async def test_tries_at_once_make_one_job_and_all_get_its_id(
    queue: JobQueue, aredis: Redis
) -> None:
    submitted = await asyncio.gather(*(queue.submit_once(keyed()) for _ in range(20)))
    assert len({s.job_id for s in submitted}) == 1
    assert [s.replayed for s in submitted].count(False) == 1
    assert len(await jobs(aredis)) == 1


async def test_the_same_key_with_another_request_is_refused_and_changes_nothing(
    queue: JobQueue, aredis: Redis
) -> None:
    first = await queue.submit_once(keyed())
    another = {**BODY, "max_tokens": 3}
    with pytest.raises(IdempotencyKeyReused, match="different request"):
        await queue.submit_once(keyed(body=another))
    # Another model is another slot on a cluster: the claim, in alice's, still sees it.
    with pytest.raises(IdempotencyKeyReused):
        await queue.submit_once(keyed(body={**BODY, "model": OTHER}, model=OTHER))
    assert await jobs(aredis) == [keys.job(MODEL, first.job_id).encode()]
    assert await jobs(aredis, OTHER) == []


async def test_the_job_record_refuses_another_request_even_without_the_claim(
    queue: JobQueue, aredis: Redis
) -> None:
    """The claim expired a moment before the record (they are written one call apart)."""
    first = keyed()
    await queue.submit_once(first)
    assert first.once is not None
    await aredis.delete(first.once.claim)
    with pytest.raises(IdempotencyKeyReused):
        await queue.submit_once(keyed(body={**BODY, "max_tokens": 3}))
    assert len(await jobs(aredis)) == 1


async def test_a_key_is_scoped_to_its_user_and_route(queue: JobQueue, aredis: Redis) -> None:
    made = {
        (await queue.submit_once(keyed(owner=owner, route=route))).job_id
        for owner in ("alice", "bob")
        for route in ("chat", "completion")
    }
    assert len(made) == 4 and len(await jobs(aredis)) == 4


async def test_a_retry_gets_its_job_while_its_users_queue_is_full(
    queue: JobQueue, aredis: Redis
) -> None:
    first = await queue.submit_once(keyed())
    await queue.submit(submission("alice"))  # the queue holds 2 now: full
    again = await queue.submit_once(keyed())
    assert again == Submitted(first.job_id, replayed=True)
    with pytest.raises(QueueFull):  # a new request is refused, and records nothing
        await queue.submit_once(keyed("key-2"))
    assert len(await jobs(aredis)) == 2


async def test_a_try_that_died_after_its_claim_leaves_the_job_to_its_retry(
    queue: JobQueue, aredis: Redis
) -> None:
    dead = keyed()
    assert dead.once is not None
    await bind(aredis, dead.once)  # ... and its gateway was killed before enqueue.lua
    retried = await queue.submit_once(keyed())
    assert not retried.replayed and len(await jobs(aredis)) == 1


async def test_submit_returns_the_job_the_key_made(queue: JobQueue) -> None:
    assert await queue.submit(keyed()) == await queue.submit(keyed())


async def test_a_job_sent_express_is_recorded_as_a_queued_one(
    queue: JobQueue, aredis: Redis, settings: Settings
) -> None:
    dispatch = DispatchStore(aredis, settings)
    sequence = (await dispatch.snapshot(MODEL, 1)).sequence
    assert await dispatch.grant(MODEL, Grant(EP, {"default": 3}), sequence, 60_000)
    first = await queue.submit_once(keyed())
    assert (await queue.get(first.job_id, "alice")).state is JobState.DISPATCHED
    assert await queue.submit_once(keyed()) == Submitted(first.job_id, replayed=True)
    assert await aredis.xlen(keys.ready(MODEL)) == 1  # sent once
