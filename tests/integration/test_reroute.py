"""A job whose replica vanished before its engine took it is sent to another replica.

Real parts: the simulator and the gateway under uvicorn on 127.0.0.1, a real Redis, and a
dispatcher and a worker in the test's event loop. The client streams through the gateway.
The job is first dispatched, by the test, to a replica that is gone by the time the worker
calls it (as when a dispatcher admitted to a pod just before it was killed): a closed
port, or a pod that answers 503 while it shuts down. The worker's tries there fail, it
hands the job back (``reroute.lua``), and the dispatcher sends it to the replica that is
there: the client gets that replica's whole answer, each token once, its usage once.
Where no replica takes it, the job fails after ``engine_max_reroutes`` hand-backs with an
error naming the last endpoint and its reason. A job that had output when its replica
went is not run again (the rule in place: it fails with the engine's reason, and its
client keeps what it had, once). Last, a replica process killed under load: its job
mid-answer fails so, the jobs waiting in its queue (taken, no token yet) are served by
the other replica, and no job is lost or ends twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx
import orjson
import pytest
import yaml
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from broker import (
    AsyncClient,
    DispatchStore,
    JobFailed,
    JobRecord,
    JobState,
    Pick,
    Settings,
    keys,
    read_queues,
)
from fairq.stack.localredis import free_port
from sim import create_app as create_sim
from tests.support import local_http
from tests.support.eventually import WAIT_S, aeventually
from tests.support.processes import ProcessGroups, kill_group
from tests.support.servers import uvicorn_thread
from tests.support.settings import ALICE, ALICE_KEY, BOB_KEY, MODEL, SIM_FAULTS, make_settings
from tests.support.stack import FAST, components, gateway, sim, wait_healthy

pytestmark = pytest.mark.integration

TOKENS = 8
# No preemption: each stream here must be one engine answer as sent.
MODEL_FIELDS = {"admission": "metrics", "preemption": False}


@contextlib.contextmanager
def gone_replica(how: str) -> Iterator[str]:
    """A replica that is gone: a port where nothing listens (the pod was deleted), or one
    that answers 503 on every route (a pod going away, or not ready again). Its scrapes
    fail too, so the dispatcher sends it nothing more."""
    if how == "refuses connections":
        yield f"http://127.0.0.1:{free_port()}"
        return
    with uvicorn_thread(create_sim([MODEL], FAST, startup_s=3600.0)) as url:
        yield url


def settings_of(redis_url: str, endpoints: list[str], **overrides: Any) -> Settings:
    fields = {**MODEL_FIELDS, **overrides.pop("model_fields", {})}
    return make_settings(redis_url, endpoints, quick=True, model_fields=fields, **overrides)


class Answer:
    """A streamed answer as the gateway sent it."""

    def __init__(self, status: int, raw: bytes) -> None:
        self.status, self.raw = status, raw
        self.events = [e for e in raw.split(b"\n\n") if e.strip()]
        data = [e.split(b"data: ", 1)[1] for e in self.events if b"data: {" in e]
        self.chunks = [orjson.loads(d) for d in data]
        self.ids = [line for e in self.events for line in e.split(b"\n") if line[:4] == b"id: "]

    @property
    def tokens(self) -> list[str]:
        return [
            c["choices"][0]["delta"]["content"]
            for c in self.chunks
            if c.get("choices") and c["choices"][0].get("delta", {}).get("content")
        ]

    @property
    def usages(self) -> list[dict[str, int]]:
        return [c["usage"] for c in self.chunks if c.get("usage")]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [c["error"] for c in self.chunks if "error" in c]


BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello"}],
    "max_tokens": TOKENS,
    "stream": True,
    "stream_options": {"include_usage": True},
}


async def ask(http: httpx.AsyncClient, base: str, job: asyncio.Future[str], **extra: Any) -> Answer:
    """Stream one request through the gateway; ``job`` gets its id as soon as it is queued
    (the early headers)."""
    headers = {**ALICE, "X-Fairq-Stream-Headers": "early"}
    url = f"{base}/v1/chat/completions"
    async with http.stream("POST", url, json={**BODY, **extra}, headers=headers) as response:
        job.set_result(response.headers["X-Fairq-Job-Id"])
        return Answer(response.status_code, await response.aread())


async def dispatched_to(redis: Redis, settings: Settings, job_id: str, endpoint: str) -> bytes:
    """Dispatch the queued job to ``endpoint`` as a dispatcher would have while the
    replica was still there; its engine payload."""
    await aeventually(
        lambda: redis.hget(keys.job(MODEL, job_id), "st"), "the job to be queued",
        until=lambda state: state == b"queued",
    )  # fmt: skip
    band = (await redis.hget(keys.job(MODEL, job_id), "b")).decode()
    ids, _, _ = await DispatchStore(redis, settings).dispatch(
        MODEL, endpoint, 10, [Pick(band, "alice", 1, 0)], 10
    )
    assert ids == [job_id]
    ((_, fields),) = await redis.xrange(keys.ready(MODEL))
    return fields[b"p"]


async def rerouted_run(redis_url: str, gone: str, there: str) -> tuple[Answer, bytes, str]:
    """A job first dispatched to ``gone``, served with ``there`` up: the client's answer,
    the job's engine payload, and its id."""
    settings = settings_of(redis_url, [gone, there])
    redis = Redis.from_url(redis_url)
    try:
        with gateway(settings) as base:
            async with httpx.AsyncClient(timeout=WAIT_S) as http:
                job: asyncio.Future[str] = asyncio.get_running_loop().create_future()
                asking = asyncio.create_task(ask(http, base, job))
                try:
                    payload = await dispatched_to(redis, settings, await job, gone)
                    async with components(settings):
                        answer = await asyncio.wait_for(asking, WAIT_S)
                finally:
                    asking.cancel()
                    await asyncio.gather(asking, return_exceptions=True)
        return answer, payload, job.result()
    finally:
        await redis.aclose()


async def served(
    redis_url: str, settings: Settings, **extra: Any
) -> tuple[Answer, dict[bytes, bytes]]:
    """One request through the gateway, with the dispatcher and a worker running; the
    client's answer and the job's record once it ended."""
    with gateway(settings) as base:
        async with httpx.AsyncClient(timeout=WAIT_S) as http, components(settings):
            job: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            answer = await asyncio.wait_for(ask(http, base, job, **extra), WAIT_S)
    redis = Redis.from_url(redis_url)
    try:
        return answer, await redis.hgetall(keys.job(MODEL, job.result()))
    finally:
        await redis.aclose()


def reroutes(outcome: str) -> float:
    return REGISTRY.get_sample_value("fairq_worker_reroutes_total", {"outcome": outcome}) or 0.0


def engine_answer(there: str, payload: bytes) -> Answer:
    """What the replica answers the job's own request, asked directly."""
    response = local_http.post(
        f"{there}/v1/chat/completions",
        content=payload,
        headers={"Content-Type": "application/json"},
        timeout=WAIT_S,
    )
    return Answer(response.status_code, response.content)


async def check_served_by(redis_url: str, answer: Answer, payload: bytes, job_id: str,
                          there: str) -> None:  # fmt: skip
    """The client got ``there``'s whole answer to the job, each token once, usage once."""
    assert answer.status == 200 and answer.errors == []
    assert len(answer.tokens) == TOKENS
    assert answer.tokens == engine_answer(there, payload).tokens  # the same answer, whole
    assert len(set(answer.ids)) == len(answer.ids)  # no event twice
    assert [u["completion_tokens"] for u in answer.usages] == [TOKENS]
    redis = Redis.from_url(redis_url)
    try:
        h = keys.job(MODEL, job_id)
        state, endpoint, handed, attempts = await redis.hmget(h, "st", "ep", "rr", "att")
        assert (state, endpoint, handed, attempts) == (b"completed", there.encode(), b"1", b"1")
        usage = orjson.loads(await redis.hget(h, "usage"))
        assert usage["completion_tokens"] == TOKENS
    finally:
        await redis.aclose()


@pytest.mark.parametrize("how", ["refuses connections", "answers 503"])
async def test_a_job_whose_replica_went_before_taking_it_is_served_by_the_one_that_is_there(
    redis_url: str, how: str
) -> None:
    before = reroutes("rerouted")
    with gone_replica(how) as gone, sim() as there:
        answer, payload, job_id = await rerouted_run(redis_url, gone, there)
        await check_served_by(redis_url, answer, payload, job_id, there)
    assert reroutes("rerouted") - before == 1


async def test_where_no_replica_takes_it_the_job_fails_after_the_allowed_hand_backs(
    redis_url: str,
) -> None:
    # Static admission: the dispatcher has no health to go by, so it sends the job to
    # endpoints that are gone, again and again; the bound ends that.
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    before = reroutes("rerouted"), reroutes("exhausted")
    settings = settings_of(
        redis_url, dead, engine_max_reroutes=2, model_fields={"admission": "static"}
    )
    answer, record = await served(redis_url, settings)
    assert [record.get(b"st"), record.get(b"rr")] == [b"failed", b"2"]
    error = orjson.loads(record[b"err"])
    # The client's stream (its headers went out early) ends with the error, no token.
    assert answer.tokens == [] and answer.usages == []
    assert [e["code"] for e in answer.errors] == ["engine_unavailable"]
    assert error["code"] == "engine_unavailable" and error["status"] == 503
    message = str(error["message"])
    assert any(url in message for url in dead) and "could not be reached" in message
    assert "2 time(s)" in message
    assert (reroutes("rerouted") - before[0], reroutes("exhausted") - before[1]) == (2, 1)


async def test_a_job_with_output_when_its_replica_went_is_not_run_again(
    redis_url: str,
) -> None:
    # The replica's connection closes after two tokens (a pod killed mid-answer), while
    # another replica is there: the rule in place holds, the job fails with the engine's
    # reason and its client keeps the two tokens it had, once.
    before = reroutes("rerouted")
    with sim() as first, sim() as second:
        settings = settings_of(redis_url, [first, second], model_fields=SIM_FAULTS)
        cut = {"sim_fault": {"kind": "cut", "after_tokens": 2}}
        answer, record = await served(redis_url, settings, **cut)
    error = orjson.loads(record[b"err"])
    # One attempt, not handed back.
    assert (record[b"st"], record.get(b"rr"), record[b"att"]) == (b"failed", None, b"1")
    assert len(answer.tokens) == 2 and len(set(answer.ids)) == len(answer.ids)
    assert [e["code"] for e in answer.errors] == ["engine_stream_cut"]
    assert error["code"] == "engine_stream_cut"
    assert reroutes("rerouted") == before


# One job in the replica's batch at a time, slow steps: when it is killed it holds one job
# mid-answer and others waiting in its queue, taken (their response headers went out) but
# without a token yet.
SLOW = {"max_num_seqs": 1, "step_base_ms": 25.0, "default_output_tokens": TOKENS}
NO_BATCH = {"batch_slots": 0}


def start_replica(
    processes: ProcessGroups, port: int, profile: Path, startup_s: float = 0.0
) -> Popen[bytes]:
    """A ``fairq sim`` process; one with ``startup_s`` answers 503 that long (loading)."""
    args = ["sim", "--host", "127.0.0.1", "--port", str(port), "--model", MODEL]
    args += ["--profile", str(profile), "--startup-s", str(startup_s)]
    proc = processes.start(
        [sys.executable, "-m", "fairq", *args],
        env={**os.environ, "FAIRQ_LOG_LEVEL": "WARNING"},
    )
    if not startup_s:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, f"the replica on port {port}")
    return proc


async def test_a_replica_killed_under_load_loses_no_job_and_repeats_no_token(
    redis_url: str, processes: ProcessGroups, tmp_path: Path
) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(SLOW))
    a, b = free_port(), free_port()
    killed = start_replica(processes, a, profile)
    # b is loading (503) for the first seconds: every job goes to a first.
    start_replica(processes, b, profile, startup_s=2.0)
    there = f"http://127.0.0.1:{b}"
    # No batch rule: a takes up to its queue target (3) beyond the one it runs.
    settings = settings_of(redis_url, [f"http://127.0.0.1:{a}", there], model_fields=NO_BATCH)
    before = reroutes("rerouted")
    redis = Redis.from_url(redis_url)
    clients = [AsyncClient(settings, api_key=key) for key in (ALICE_KEY, BOB_KEY)]
    try:
        async with components(settings):
            prompt = [{"role": "user", "content": "hi"}]
            jobs = {
                await client.submit(MODEL, messages=prompt, max_tokens=TOKENS, stream=True): client
                for _ in range(4)
                for client in clients
            }

            async def at_a() -> tuple[int, bool]:
                """a's jobs, and whether one of them is mid-answer."""
                counts = (await read_queues(redis, MODEL, settings.bands, 0)).inflight
                streams = [await redis.xrange(keys.results(MODEL, j)) for j in jobs]
                mid = any(
                    any(b"d" in f for _, f in s) and not any(b"end" in f for _, f in s)
                    for s in streams
                )  # fmt: skip
                return counts.get(f"http://127.0.0.1:{a}", 0), mid

            # a holds a job mid-answer and others behind it when it goes.
            await aeventually(
                at_a, "a job mid-answer at a and others waiting there",
                until=lambda seen: seen[0] >= 3 and seen[1], interval_s=0.005,
            )  # fmt: skip
            kill_group(killed)
            async with asyncio.timeout(WAIT_S):  # each stream reads to its job's end
                outcomes = [await ended(redis, c, job_id) for job_id, c in jobs.items()]
    finally:
        for client in clients:
            await client.aclose()
        await redis.aclose()
    completed = [o for o in outcomes if o.state is JobState.COMPLETED]
    failed = [o for o in outcomes if o.state is not JobState.COMPLETED]
    # Every job ended once. One that had output when a went fails with the engine's
    # reason, its client keeping what it had; every other one completes whole.
    assert all(len(o.tokens) == TOKENS and o.usage == TOKENS for o in completed)
    assert all(o.code == "engine_stream_cut" and 0 < len(o.tokens) < TOKENS for o in failed)
    assert len(failed) == 1  # a ran one job at a time
    # The jobs waiting at a (two at least) were handed back, and served by b.
    handed = [o for o in outcomes if o.handed]
    assert len(handed) >= 2 and all(o.endpoint == there for o in handed)
    assert all(o.state is JobState.COMPLETED for o in handed)
    assert reroutes("rerouted") - before == sum(o.handed for o in outcomes)


class Ended:
    """A job as it ended, with what its client reads of it."""

    def __init__(self, record: JobRecord, tokens: list[str], handed: int) -> None:
        self.state, self.endpoint, self.tokens, self.handed = (
            record.state, record.endpoint, tokens, handed
        )  # fmt: skip
        self.usage = (record.usage or {}).get("completion_tokens")
        self.code = (record.error or {}).get("code")


async def ended(redis: Redis, client: AsyncClient, job_id: str) -> Ended:
    tokens = []
    with contextlib.suppress(JobFailed):
        async for chunk in client.stream(job_id):
            for choice in chunk.get("choices") or []:
                if text := (choice.get("delta") or {}).get("content"):
                    tokens.append(text)
    ends = [f for _, f in await redis.xrange(keys.results(MODEL, job_id)) if b"end" in f]
    assert len(ends) == 1, (job_id, ends)  # ended exactly once
    handed = int(await redis.hget(keys.job(MODEL, job_id), "rr") or 0)
    return Ended(await client.status(job_id), tokens, handed)
