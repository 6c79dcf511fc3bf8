"""Worker crashes: real ``fairq worker`` subprocesses SIGKILLed in the middle of a job.

The dispatcher runs in the test's event loop, the engine simulator in a thread;
the workers are real processes, killed with SIGKILL (no chance to clean up).
Leases are short (``QUICK`` in tests/support/settings.py), so another worker takes the
job over within about a second.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from redis.asyncio import Redis

from broker import AsyncClient, ExecutionStore, JobFailed, JobState, ResultEvent, keys
from fairq.stack.localredis import free_port
from tests.support.eventually import WAIT_S, aeventually
from tests.support.settings import (
    ADMIN,
    ALICE,
    ALICE_KEY,
    MODEL,
    SIM_FAULTS,
    make_config,
    make_settings,
)
from tests.support.stack import WorkerProcesses, components, metric, sim, state_is
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

PROMPT = [{"role": "user", "content": "hello"}]


@pytest.fixture
def engine() -> Iterator[str]:
    with sim() as url:
        yield url


@pytest.fixture
async def client(redis_url: str, engine: str) -> AsyncIterator[AsyncClient]:
    settings = make_settings(redis_url, [engine], quick=True, model_fields=SIM_FAULTS)
    async with AsyncClient(settings, api_key=ALICE_KEY) as c:
        yield c


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()  # SIGKILL: no drain, no cleanup, the entry stays pending in the group
    proc.wait(10)


async def read_all(client: AsyncClient, job_id: str) -> tuple[list[ResultEvent], JobFailed | None]:
    events: list[ResultEvent] = []
    try:
        async for event in client.events(job_id):
            events.append(event)
    except JobFailed as exc:
        return events, exc
    return events, None


def tokens(events: list[ResultEvent]) -> list[bytes]:
    """Every SSE event of the chunk entries, in order (one per token, plus the role)."""
    return [e for ev in events if ev.chunk for e in ev.chunk.split(b"\n\n") if e]


async def ends(redis: Redis, job_id: str) -> list[bytes]:
    entries = await redis.xrange(keys.results(MODEL, job_id))
    return [fields[b"end"] for _, fields in entries if b"end" in fields]


async def test_a_worker_killed_before_the_first_token_has_its_job_retried_to_one_completion(
    redis_url: str, engine: str, aredis: Redis, client: AsyncClient
) -> None:
    procs = WorkerProcesses(make_config([engine], quick=True), redis_url)
    try:
        async with components(make_settings(redis_url, [engine], quick=True), workers=0):
            # The engine says nothing on the first call: the first worker waits in silence.
            fault = {"kind": "hang", "after_tokens": 0, "times": 1}
            job_id = await client.submit(
                MODEL, messages=PROMPT, stream=True, max_tokens=6, sim_fault=fault
            )
            first = procs.spawn()
            await aeventually(lambda: state_is(aredis, job_id, "running", 1), "the first start")
            kill(first)
            procs.spawn()
            events, failure = await read_all(client, job_id)
    finally:
        procs.close()
    assert failure is None
    assert events[-1].end is JobState.COMPLETED
    assert len(tokens(events)) == 1 + 6  # the role chunk and six tokens, each once
    # The first attempt's acceptance mark (0-1), then the retry's output: its own start
    # found the mark there and added none.
    assert [e.id for e in events if e.accepted] == [b"0-1"]
    chunk_ids = [e.id for e in events if e.chunk]
    assert chunk_ids == [b"0-%d" % i for i in range(2, len(chunk_ids) + 2)]
    assert await ends(aredis, job_id) == [b"completed"]  # exactly one end
    job = await client.status(job_id)
    assert job.state is JobState.COMPLETED and job.attempts == 2


async def test_a_worker_killed_after_the_first_token_fails_the_job_without_repeating_text(
    redis_url: str, engine: str, aredis: Redis, client: AsyncClient
) -> None:
    procs = WorkerProcesses(make_config([engine], quick=True), redis_url)
    try:
        async with components(make_settings(redis_url, [engine], quick=True), workers=0):
            fault = {"kind": "hang", "after_tokens": 2}  # two tokens, then silence
            job_id = await client.submit(
                MODEL, messages=PROMPT, stream=True, max_tokens=6, sim_fault=fault
            )
            first = procs.spawn()
            # Entry 0-1 is the engine's acceptance mark; output starts at 0-2.
            await aeventually(
                lambda: aredis.xlen(keys.results(MODEL, job_id)),
                "the first output in Redis",
                until=lambda entries: entries >= 2,
            )
            kill(first)
            procs.spawn()
            async with asyncio.timeout(WAIT_S):
                events, failure = await read_all(client, job_id)
    finally:
        procs.close()
    assert failure is not None and failure.state == "failed"
    assert "not retried" in failure.message
    sent = tokens(events)
    assert 1 <= len(sent) <= 3 and len(set(sent)) == len(sent)  # role + at most 2, none twice
    assert await ends(aredis, job_id) == [b"failed"]
    job = await client.status(job_id)
    assert job.state is JobState.FAILED and job.error is not None
    assert job.error["code"] == "worker_lost" and job.attempts == 1


async def test_a_job_that_kills_every_worker_becomes_a_dead_letter_after_n_attempts(
    redis_url: str, engine: str, aredis: Redis, client: AsyncClient
) -> None:
    cfg = make_config([engine], quick=True, job_max_attempts=2)
    settings = make_settings(redis_url, **cfg)
    procs = WorkerProcesses(cfg, redis_url)
    port = free_port()
    try:
        async with components(settings, workers=0):
            fault = {"kind": "hang", "after_tokens": 0}  # every call: silence, so we kill
            job_id = await client.submit(
                MODEL, messages=PROMPT, stream=True, max_tokens=6, sim_fault=fault
            )
            for attempt in (1, 2):
                worker = procs.spawn()
                await aeventually(
                    lambda a=attempt: state_is(aredis, job_id, "running", a), f"start {attempt}"
                )
                kill(worker)
            last = procs.spawn(metrics_port=port)
            events, failure = await read_all(client, job_id)
            dead_letters = metric(f"http://127.0.0.1:{port}", "fairq_worker_dead_letters_total")
            assert last.poll() is None
    finally:
        procs.close()
    assert failure is not None and "dead letter" in failure.message
    assert tokens(events) == []
    assert dead_letters == 1
    with gateway_server(settings) as url, httpx.Client(base_url=url, timeout=5) as http:
        job = http.get(f"/v1/jobs/{job_id}", headers=ALICE).json()
        assert job["status"] == "failed" and job["attempts"] == 2
        assert job["error"]["code"] == "dead_letter"
        listed = http.get("/v1/admin/dead-letters", params={"model": MODEL}, headers=ADMIN)
        assert [j["id"] for j in listed.json()["data"]] == [job_id]
        refused = http.get("/v1/admin/dead-letters", params={"model": MODEL}, headers=ALICE)
        assert refused.status_code == 404  # to a non-admin, as if the route did not exist


async def test_the_names_of_gone_workers_leave_the_ready_group_never_one_holding_a_job(
    aredis: Redis, redis_url: str
) -> None:
    model = "forget-test"
    settings = make_settings(redis_url, model=model, forget_consumer_after_ms=1000)
    store = ExecutionStore(aredis, settings)
    await store.ensure_groups([model])
    ready, group = keys.ready(model), keys.READY_GROUP
    for job in ("a", "b"):
        await aredis.xadd(ready, {"j": job})
    ((_, [(done, _)]),) = await aredis.xreadgroup(group, "gone", {ready: ">"}, count=1)
    await aredis.xack(ready, group, done)  # its job ended, then the worker died
    await aredis.xreadgroup(group, "holding", {ready: ">"}, count=1)  # died with a job
    await asyncio.sleep(1.1)  # both idle past forget_consumer_after_ms
    await aredis.xreadgroup(group, "live", {ready: ">"}, count=1, block=10)  # just read
    assert await store.forget_gone_consumers(model) == ["gone"]
    names = {c["name"].decode() for c in await aredis.xinfo_consumers(ready, group)}
    assert names == {"holding", "live"}  # the held job stays for reclaim to find
    assert (await aredis.xpending(ready, group))["pending"] == 1


async def test_a_malformed_ready_entry_is_removed_and_the_jobs_beside_it_run(
    aredis: Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = "poison-test"
    settings = make_settings(redis_url, model=model)
    store = ExecutionStore(aredis, settings)
    await store.ensure_groups([model])
    ready = keys.ready(model)
    good = {"j": "job-1", "p": "{}", "k": "chat", "s": "1", "ep": "http://e", "b": "default",
            "u": "alice"}  # fmt: skip
    bad = await aredis.xadd(ready, {"j": "job-0", "k": "no-such-kind"})  # no payload either
    await aredis.xadd(ready, good)
    blocking = Redis.from_url(redis_url)
    try:
        claimed = await store.claim(blocking, [model], "w1", count=10, block_ms=100)
    finally:
        await blocking.aclose()
    assert [job.job_id for job in claimed] == ["job-1"]
    assert bad not in [entry_id for entry_id, _ in await aredis.xrange(ready)]
    pending = await aredis.xpending_range(ready, keys.READY_GROUP, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [claimed[0].entry_id]  # only the good one
    assert "is malformed" in caplog.text and bad.decode() in caplog.text


async def _blocked_claims(redis: Redis) -> list[int]:
    """Client ids of connections blocked in XREADGROUP (a worker's claim read)."""
    return [int(c["id"]) for c in await redis.client_list()
            if c["cmd"] == "xreadgroup" and "b" in c["flags"]]  # fmt: skip


async def test_a_claim_whose_reply_was_lost_runs_without_waiting_for_a_lease(
    redis_url: str, engine: str, aredis: Redis, client: AsyncClient
) -> None:
    # One place, and a lease far longer than the wait below: only the worker's own
    # recovery can run the job in time.
    settings = make_settings(
        redis_url, [engine], quick=True, lease_ms=120_000, lease_renew_ms=1000, worker_concurrency=1
    )
    async with components(settings) as [worker]:
        fault = {"kind": "hang", "after_tokens": 0}
        busy = await client.submit(MODEL, messages=PROMPT, stream=True, sim_fault=fault)
        await aeventually(lambda: state_is(aredis, busy, "running"), "the first job runs")
        job_id = await client.submit(MODEL, messages=PROMPT, stream=True, max_tokens=4)
        await aeventually(lambda: state_is(aredis, job_id, "dispatched"), "the job dispatched")
        # Redis delivers the entry to the worker, whose reply is then lost: it never sees it.
        delivered = await aredis.xreadgroup(
            keys.READY_GROUP, worker.name, {keys.ready(MODEL): ">"}, count=1
        )
        assert delivered and delivered[0][1][0][1][b"j"].decode() == job_id
        await client.cancel(busy)  # the worker's place frees; it reads again and blocks
        [claim] = await aeventually(lambda: _blocked_claims(aredis), "the worker's next read")
        await aredis.client_kill_filter(_id=claim)  # the connection breaks
        async with asyncio.timeout(WAIT_S):
            events, failure = await read_all(client, job_id)
    assert failure is None and events[-1].end is JobState.COMPLETED
    assert len(tokens(events)) == 1 + 4
    job = await client.status(job_id)
    assert job.attempts == 1  # run once, by the worker it was delivered to
