"""A model's replicas found through DNS, live, with real parts: a DNS server on 127.0.0.1
whose zone the test changes, ``fairq sim`` replicas on loopback addresses of their own
(one port, as pods behind a headless Service), a real Redis, and ``fairq dispatcher``
and ``fairq worker`` processes. Replicas come and go under load and every job ends
completed exactly once; a model with no record holds its jobs (its band deadlines still
apply) and serves them once a replica is found and healthy; the express grant names only
a replica the records name."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from redis.asyncio import Redis

from broker import AsyncClient, JobState, Settings, keys, read_queues
from fairq.stack.localredis import free_port
from tests.support.dns import Zone, dns_server
from tests.support.eventually import aeventually
from tests.support.processes import ProcessGroups
from tests.support.settings import ALICE_KEY, BOB_KEY, MODEL, make_config, make_settings
from tests.support.stack import wait_healthy

pytestmark = pytest.mark.integration

NAME = "engine-m1.fairq.svc.cluster.local"
TOKENS = 12  # max_tokens of every job: its stream holds exactly this many
# Slow enough that a replica has jobs running when it leaves; small enough to queue.
PROFILE = {"max_num_seqs": 4, "step_base_ms": 8.0, "default_output_tokens": TOKENS}
DISCOVERY_S = 0.2  # how often the dispatcher reads the records


class Replicas:
    """``fairq sim`` processes serving MODEL, each on a loopback address of its own and
    one port; the DNS zone names those that are "ready"."""

    def __init__(self, groups: ProcessGroups, zone: Zone, profile: Path) -> None:
        self.port = free_port()
        self._groups, self._zone, self._profile = groups, zone, profile
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ready: list[str] = []
        zone.set(NAME, [])  # the Service exists, with no ready pod

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}"

    def start(self, host: str) -> None:
        args = ["sim", "--host", host, "--port", str(self.port), "--model", MODEL]
        proc = self._groups.start(
            [sys.executable, "-m", "fairq", *args, "--profile", str(self._profile)],
            env={**os.environ, "FAIRQ_LOG_LEVEL": "WARNING"},
        )
        self._procs[host] = proc
        wait_healthy(f"{self.url(host)}/health", proc, f"the replica at {host}")

    def publish(self, *hosts: str) -> None:
        """The records name exactly ``hosts`` (as the Service's ready pods change)."""
        self.ready = list(hosts)
        self._zone.set(NAME, hosts)

    def stop(self, host: str) -> None:
        """The replica's process ends (SIGTERM: uvicorn finishes what it serves first)."""
        proc = self._procs.pop(host)
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def fleet(processes: ProcessGroups, tmp_path: Path) -> Iterator[tuple[Replicas, str]]:
    """Replicas, and the nameserver a model's ``discovery`` asks."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    with dns_server() as (zone, nameserver):
        yield Replicas(processes, zone, profile), nameserver


def start_fairq(
    groups: ProcessGroups, redis_url: str, tmp_path: Path, nameserver: str, port: int, **extra: Any
) -> Settings:
    """``fairq dispatcher`` and two ``fairq worker`` processes for MODEL, whose replicas are
    the records of NAME; returns their settings."""
    discovery = {
        "dns": NAME,
        "port": port,
        "interval_s": DISCOVERY_S,
        "nameservers": [nameserver],
    }
    # No preemption: its take-backs rewrite streams (tests/integration/test_first_token.py
    # covers them); here each stream must be the engine's one answer, as sent.
    model = {"admission": "metrics", "endpoints": [], "discovery": discovery, "preemption": False}
    # Leases longer than quick's: nothing here kills a worker, and on a loaded machine a
    # worker's renewal can be late by more than quick's 800 ms.
    leases = {"lease_ms": 10_000, "lease_renew_ms": 1000}
    config = make_config(
        quick=True, model_fields=model, status_interval_s=0.2, **{**leases, **extra}
    )
    path = tmp_path / "fairq.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "FAIRQ_CONFIG": str(path), "FAIRQ_REDIS_URL": redis_url,
           "FAIRQ_LOG_LEVEL": "WARNING", "FAIRQ_METRICS_PORT": "0"}  # fmt: skip
    for role in ("dispatcher", "worker", "worker"):
        groups.start([sys.executable, "-m", "fairq", role], env=env)
    return make_settings(redis_url, **config)


async def inflight(redis: Redis, settings: Settings) -> dict[str, int]:
    return (await read_queues(redis, MODEL, settings.bands, 0)).inflight


async def status_endpoints(redis: Redis) -> list[str]:
    """The endpoints the dispatcher's last status snapshot shows (its live set)."""
    raw = await redis.get(keys.status(MODEL))
    return [] if raw is None else [row["url"] for row in orjson.loads(raw)["endpoints"]]


async def submit(client: AsyncClient, count: int, **body: Any) -> list[str]:
    prompt = [{"role": "user", "content": "hi"}]
    return [
        await client.submit(MODEL, messages=prompt, max_tokens=TOKENS, stream=True, **body)
        for _ in range(count)
    ]


async def check_exactly_once(redis: Redis, client: AsyncClient, jobs: list[str]) -> None:
    """Every job completed, once: its result stream holds one end, and its client reads
    TOKENS tokens, none twice (a retry after output would repeat them)."""
    for job_id in jobs:
        record = await client.status(job_id)
        assert record.state is JobState.COMPLETED, (job_id, record.state, record.error)
        entries = await redis.xrange(keys.results(MODEL, job_id))
        ends = [f for _, f in entries if b"end" in f]
        assert len(ends) == 1, (job_id, ends)
        tokens = [
            text
            async for chunk in client.stream(job_id)
            for choice in chunk.get("choices") or []
            if (text := (choice.get("delta") or {}).get("content"))
        ]
        assert len(tokens) == TOKENS, (job_id, tokens)
        assert (record.usage or {}).get("completion_tokens") == TOKENS


async def wait_all_ended(client: AsyncClient, jobs: list[str], timeout_s: float) -> None:
    async def ended() -> bool:
        states = [(await client.status(j)).state for j in jobs]
        return all(s.terminal for s in states)

    await aeventually(ended, f"{len(jobs)} jobs to end", timeout_s, interval_s=0.1)


async def test_replicas_come_and_go_through_dns_under_load_and_every_job_ends_once(
    fleet: tuple[Replicas, str], processes: ProcessGroups, redis_url: str, tmp_path: Path
) -> None:
    replicas, nameserver = fleet
    a, b, c = "127.0.0.1", "127.0.0.2", "127.0.0.3"
    for host in (a, b, c):
        replicas.start(host)
    replicas.publish(a)
    settings = start_fairq(processes, redis_url, tmp_path, nameserver, replicas.port)
    redis = Redis.from_url(redis_url)
    alice = AsyncClient(settings, api_key=ALICE_KEY)
    bob = AsyncClient(settings, api_key=BOB_KEY)
    try:
        await aeventually(lambda: status_endpoints(redis), "the dispatcher to find replica a")
        owners: dict[str, AsyncClient] = {}

        async def load(client: AsyncClient, count: int) -> None:
            owners.update(dict.fromkeys(await submit(client, count), client))

        await load(alice, 30)
        await load(bob, 30)
        # Two replicas appear while a has a queue: both get jobs.
        replicas.publish(a, b, c)
        await load(alice, 20)
        # a leaves the Service while it serves jobs (a pod terminating), read in the same
        # look as b's and c's (a second look may find a's short jobs ended): no new job
        # goes there, the ones it has end there, then its process stops.
        await aeventually(
            lambda: inflight(redis, settings),
            "jobs running on a, b and c at once",
            until=lambda counts: all(counts.get(replicas.url(h)) for h in (a, b, c)),
        )
        replicas.publish(b, c)
        await aeventually(
            lambda: status_endpoints(redis),
            "the dispatcher to drop a",
            until=lambda urls: replicas.url(a) not in urls,
        )
        before_a_left = set(owners)
        await load(bob, 20)
        await aeventually(
            lambda: inflight(redis, settings),
            "a's jobs to end",
            until=lambda counts: not counts.get(replicas.url(a)),
        )
        replicas.stop(a)
        await load(alice, 10)
        for client in (alice, bob):
            await wait_all_ended(client, [j for j, c in owners.items() if c is client], 40)
        served: dict[str, set[str]] = {}
        for job_id, client in owners.items():
            await check_exactly_once(redis, client, [job_id])
            record = await client.status(job_id)
            served.setdefault(record.endpoint or "", set()).add(job_id)
        assert len(owners) == 110
        assert set(served) == {replicas.url(h) for h in (a, b, c)}
        assert served[replicas.url(a)] <= before_a_left  # nothing sent to a after it left
    finally:
        await alice.aclose()
        await bob.aclose()
        await redis.aclose()


async def test_a_model_without_replicas_holds_its_jobs_and_serves_them_once_one_is_healthy(
    fleet: tuple[Replicas, str], processes: ProcessGroups, redis_url: str, tmp_path: Path
) -> None:
    replicas, nameserver = fleet
    host = "127.0.0.4"
    # The band "default" may wait 1.5 s in the queue: its deadline applies while held.
    settings = start_fairq(
        processes, redis_url, tmp_path, nameserver, replicas.port,
        queue_deadline_s={"interactive": 600.0, "default": 1.5},
    )  # fmt: skip
    redis = Redis.from_url(redis_url)
    alice = AsyncClient(settings, api_key=ALICE_KEY)
    try:
        held = await submit(alice, 6)
        doomed = await submit(alice, 1, band="default")
        # The doomed job expires while held, however late the dispatcher's first round
        # comes on a loaded machine; by then discovery has read the empty records often.
        await aeventually(
            lambda: alice.status(doomed[0]),
            "the default-band job to expire while held",
            until=lambda record: record.state is JobState.EXPIRED,
            timeout_s=20,
        )
        assert {(await alice.status(j)).state for j in held} == {JobState.QUEUED}
        # A replica starts, then becomes ready: it is in the records from then on.
        replicas.start(host)
        replicas.publish(host)
        found_at = time.monotonic()
        await aeventually(
            lambda: alice.status(held[0]),
            "the first held job to leave the queue",
            until=lambda record: record.state is not JobState.QUEUED,
            interval_s=0.01,
        )
        waited_s = time.monotonic() - found_at
        # One discovery read, one good scrape, one dispatch round (and the test's polling).
        assert waited_s < DISCOVERY_S + 1.0, waited_s
        await wait_all_ended(alice, held, 20)
        await check_exactly_once(redis, alice, held)
        assert {(await alice.status(j)).endpoint for j in held} == {replicas.url(host)}
    finally:
        await alice.aclose()
        await redis.aclose()


async def grant_endpoint(redis: Redis) -> str:
    """The endpoint of the model's express grant now ("" when there is none)."""
    value = await redis.hget(keys.meta(MODEL), keys.GRANT_ENDPOINT)
    return (value or b"").decode()


async def test_the_express_grant_follows_the_records_and_a_model_without_any_has_none(
    fleet: tuple[Replicas, str], processes: ProcessGroups, redis_url: str, tmp_path: Path
) -> None:
    replicas, nameserver = fleet
    a, b = "127.0.0.5", "127.0.0.6"
    for host in (a, b):
        replicas.start(host)
    replicas.publish(a)
    settings = start_fairq(processes, redis_url, tmp_path, nameserver, replicas.port)
    redis = Redis.from_url(redis_url)
    alice = AsyncClient(settings, api_key=ALICE_KEY)
    try:
        await aeventually(
            lambda: grant_endpoint(redis), "a grant for a", until=lambda ep: ep == replicas.url(a)
        )
        replicas.publish(b)  # a's pod is replaced by b's
        await aeventually(
            lambda: grant_endpoint(redis), "a grant for b", until=lambda ep: ep == replicas.url(b)
        )
        replicas.publish()  # the model scaled to zero
        await aeventually(lambda: grant_endpoint(redis), "no grant", until=lambda ep: ep == "")
        held = await submit(alice, 3)
        await asyncio.sleep(1.0)
        assert {(await alice.status(j)).state for j in held} == {JobState.QUEUED}
        replicas.publish(a)
        await wait_all_ended(alice, held, 20)
        await check_exactly_once(redis, alice, held)
        assert {(await alice.status(j)).endpoint for j in held} == {replicas.url(a)}
    finally:
        await alice.aclose()
        await redis.aclose()
