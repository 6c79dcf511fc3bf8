"""Chaos: 300 requests of mixed users, bands and modes while a worker, a dispatcher replica
and the gateway are SIGKILLed and restarted, all real processes on one real Redis.

Afterwards every job is in exactly one terminal state, each result stream has one end
entry and gap-free chunk ids, and no client saw an event twice (clients whose gateway
died resume with Last-Event-ID on the restarted one, as a real client would).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from broker import JobState, keys
from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support.eventually import eventually
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

REQUESTS = 300
CONCURRENCY = 48
KEYS = ("fq-demo-alice", "fq-demo-bob")
BANDS = ("interactive", "default", "batch")
ENGINE = {"step_base_ms": 4.0, "step_per_seq_ms": 0.05, "max_num_seqs": 16}
LEASES = {"lease_ms": 1000, "lease_renew_ms": 200, "dispatcher_lease_ms": 600,
         "retry_backoff_ms": 20.0, "stream_resume_grace_s": 30.0}  # fmt: skip
TERMINAL = {s.value for s in JobState if s.terminal}


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    profile = tmp_path / "engine.yaml"
    profile.write_text(yaml.safe_dump(ENGINE))
    # No preemption: a job taken back mid-answer writes a fence and a second acceptance
    # mark (tests/workers/test_resume_exact.py), which this stream check does not model;
    # the chaos here is the processes'.
    no_take_back = {model: {"preemption": False} for model in DEMO_MODELS}
    with demo_stack(
        overrides=LEASES,
        per_model=no_take_back,
        profile=profile,
        redis_url=redis_url,
        workers=2,
        dispatchers=2,
        batch_workers=0,
        env={"FAIRQ_METRICS_PORT": "0"},
    ) as running:
        yield running


class Client:
    """One request as a patient client makes it: retry while the gateway is away, and
    resume a broken stream from the last event id it saw."""

    def __init__(self, http: httpx.AsyncClient, i: int) -> None:
        self.http, self.i = http, i
        self.headers = {"Authorization": f"Bearer {KEYS[i % 2]}", "X-Fairq-Band": BANDS[i % 3]}
        self.stream = i % 2 == 0
        self.job_id: str | None = None
        self.event_ids: list[str] = []
        self.outcome = "not accepted"

    def body(self) -> dict[str, Any]:
        # 80 tokens: the load must outlast the three kills (about 2 s apart from the first);
        # with 40 it once ended before the gateway's on a fast run.
        return {"model": DEMO_MODELS[(self.i // 2) % 2], "stream": self.stream,
                "max_tokens": 80,
                "messages": [{"role": "user", "content": f"request {self.i}"}]}  # fmt: skip

    async def run(self) -> None:
        for _ in range(100):  # the gateway may be down for a moment: try again
            with contextlib.suppress(httpx.TransportError):
                if self.stream:
                    await self._stream()
                else:
                    await self._plain()
                return
            if self.job_id is not None:
                await self._resume()
                return
            await asyncio.sleep(0.1)

    async def _plain(self) -> None:
        response = await self.http.post("/v1/chat/completions", json=self.body(),
                                        headers=self.headers)  # fmt: skip
        self.job_id = response.headers.get("x-fairq-job-id")
        self.outcome = f"http {response.status_code}"

    async def _stream(self) -> None:
        async with self.http.stream("POST", "/v1/chat/completions", json=self.body(),
                                    headers=self.headers) as response:  # fmt: skip
            if response.status_code != 200:
                self.outcome = f"http {response.status_code}"
                return
            self.job_id = response.headers["x-fairq-job-id"]
            await self._read(response)

    async def _resume(self) -> None:
        for _ in range(100):
            headers = dict(self.headers)
            if self.event_ids:
                headers["Last-Event-ID"] = self.event_ids[-1]
            with contextlib.suppress(httpx.TransportError):
                async with self.http.stream("GET", f"/v1/jobs/{self.job_id}/stream",
                                            headers=headers) as response:  # fmt: skip
                    await self._read(response)
                    return
            await asyncio.sleep(0.1)

    async def _read(self, response: httpx.Response) -> None:
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                self.event_ids.append(line[4:])
            elif line == "data: [DONE]":
                self.outcome = "stream done"


def chaos(stack: Stack, r: redis.Redis) -> dict[str, int]:
    """Kill and restart a worker, the dispatcher owning demo-chat, and the gateway; returns
    how many jobs were unfinished at each kill (the kills must land under load)."""
    load = {}

    def unfinished() -> int:
        return sum(state not in TERMINAL for state in job_states(r).values())

    def kill(name: str, down_s: float) -> None:
        load[name] = unfinished()
        stack.kill_and_restart(name, down_s=down_s)

    # The first kill waits for the load to be under way: on a slow machine no job was in
    # yet half a second after the clients started.
    eventually(unfinished, "jobs in flight before the first kill", 30, interval_s=0.05)
    time.sleep(0.3)
    kill("worker-0", 0.2)
    time.sleep(0.5)
    owner = (r.get(keys.owner(DEMO_MODELS[0])) or b"").decode()
    dispatchers = [n for n in stack.processes if n.startswith("dispatcher")]
    owning = [n for n in dispatchers if f"-{stack.processes[n].pid}-" in owner]
    kill((owning or dispatchers)[0], 0.2)
    time.sleep(0.5)
    kill("api", 0.3)
    return load


async def drive(stack: Stack, r: redis.Redis) -> tuple[list[Client], dict[str, int]]:
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60, limits=limits) as http:
        gate = asyncio.Semaphore(CONCURRENCY)
        clients = [Client(http, i) for i in range(REQUESTS)]

        async def run(client: Client) -> None:
            async with gate:
                await client.run()

        killed = asyncio.create_task(asyncio.to_thread(chaos, stack, r))
        await asyncio.gather(*(run(c) for c in clients))
        return clients, await killed


def job_states(r: redis.Redis) -> dict[str, str]:
    states = {}
    for model in DEMO_MODELS:
        for key in r.scan_iter(match=keys.job_pattern(model), count=1000):
            states[key.decode()] = (r.hget(key, "st") or b"?").decode()
    return states


def check_result_stream(r: redis.Redis, job_key: str) -> None:
    model, job_id = job_key.split("{", 1)[1].split("}", 1)[0], job_key.rsplit(":", 1)[1]
    entries = r.xrange(keys.results(model, job_id))
    ends = [e for e in entries if b"end" in e[1]]
    assert len(ends) == 1, f"{job_id}: {len(ends)} end entries"
    marks = [e[0] for e in entries if b"ok" in e[1]]  # start.lua's acceptance mark
    assert marks in ([], [b"0-1"]), (job_id, marks)
    chunk_ids = [e[0] for e in entries if b"end" not in e[1] and b"ok" not in e[1]]
    assert chunk_ids == [b"0-%d" % n for n in range(2, len(chunk_ids) + 2)], job_id


def test_every_job_ends_once_while_processes_are_killed(stack: Stack, redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    clients, killed = asyncio.run(drive(stack, r))
    assert len(killed) == 3 and all(unfinished > 0 for unfinished in killed.values()), killed
    states = eventually(
        lambda: job_states(r),
        "every job to end",
        60,
        until=lambda states: all(state in TERMINAL for state in states.values()),
        interval_s=0.2,
    )
    counts = collections.Counter(states.values())
    outcomes = collections.Counter(c.outcome for c in clients)
    print(f"\njobs by state: {dict(counts)}\nclients: {dict(outcomes)}\n"
          f"unfinished jobs when killed: {killed}")  # fmt: skip
    accepted = {c.job_id for c in clients if c.job_id}
    assert accepted <= {k.rsplit(":", 1)[1] for k in states}  # every accepted job is there
    assert len(states) >= len(accepted) > REQUESTS * 0.8
    assert counts[JobState.COMPLETED.value] > REQUESTS / 2
    for job_key in states:
        check_result_stream(r, job_key)
    for client in clients:  # nobody saw an event twice, nor out of order
        assert len(client.event_ids) == len(set(client.event_ids)), client.job_id
    assert stack.dead() is None  # the restarted processes are up
    r.close()
