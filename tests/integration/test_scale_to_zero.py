"""A model's engines to zero and back, with real parts: a DNS server on 127.0.0.1 (the
headless Service's records), ``fairq sim`` replicas, a real Redis, ``fairq dispatcher``
(its /metrics: the demand) and ``fairq worker`` processes, a real gateway. KEDA is
stood in for by ``ScriptedKeda``, which applies a ScaledObject's rules to the demand the
dispatcher exports, as ``fairq k8s render`` configures them (activation above 0, a
cooldown back to zero), and stops a replica as Kubernetes stops a pod: out of the
records first, then its preStop hook (``fairq k8s drain``), then the process.

A model at zero holds its first request ("starting" in ``GET /v1/jobs/{id}``), wakes on
it and serves it once the replica is ready, then goes back to zero; a replica stopped
while it streams an answer drains it whole, and fairq sends nothing new to it meanwhile.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from broker import AsyncClient, JobState, Settings, keys
from broker.results import CHUNK_FIELD
from fairq.stack.localredis import free_port
from tests.support import local_http
from tests.support.dispatcher_process import dispatcher_process
from tests.support.dns import Zone, dns_server
from tests.support.eventually import aeventually
from tests.support.processes import ProcessGroups
from tests.support.settings import ALICE, ALICE_KEY, MODEL, make_config, make_settings
from tests.support.stack import gateway, wait_healthy

pytestmark = pytest.mark.integration

NAME = "engine-m1.fairq.svc.cluster.local"
HOST = "127.0.0.5"
TOKENS = 80  # 25 ms a step: an answer streams for about 2 s
PROFILE = {"step_base_ms": 25.0, "step_per_seq_ms": 0.0, "default_output_tokens": TOKENS}
DISCOVERY_S = 0.2  # the dispatcher reads the records this often
SETTLE_S = DISCOVERY_S + 0.3  # the drain's wait for dispatchers to stop sending
DRAIN_TIMEOUT_S = 30
COOLDOWN_S = 1.0  # KEDA's cooldownPeriod, shortened
DEMAND_PER_REPLICA = 32


def demand(metrics_url: str) -> float | None:
    """``fairq_model_demand`` of MODEL as the dispatcher exports it (None: not yet)."""
    text = local_http.get(f"{metrics_url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fairq_model_demand" and sample.labels == {"model": MODEL}:
                return float(sample.value)
    return None


class ScriptedKeda:
    """One ScaledObject's rules on the dispatcher's demand, for at most one replica:
    0 -> 1 when the demand is above the activation threshold (0), 1 -> 0 after
    ``COOLDOWN_S`` without demand. A replica's record appears once it is healthy (its
    readiness probe) and goes before its drain (a terminating pod). ``events`` says
    when each step happened (wall-clock seconds, as the jobs' times in Redis)."""

    def __init__(
        self, groups: ProcessGroups, zone: Zone, metrics_url: str, profile: Path, port: int
    ) -> None:
        self.port = port
        self._groups, self._zone, self._metrics = groups, zone, metrics_url
        self._profile = profile
        self._proc: subprocess.Popen[bytes] | None = None
        self.events: dict[str, float] = {}
        zone.set(NAME, [])  # the Service exists; no pod is ready

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        args = ["sim", "--host", HOST, "--port", str(self.port), "--model", MODEL]
        self._proc = self._groups.start(
            [sys.executable, "-m", "fairq", *args, "--profile", str(self._profile)],
            env={**os.environ, "FAIRQ_LOG_LEVEL": "WARNING"},
        )
        wait_healthy(f"{self.url}/health", self._proc, "the replica")
        self._zone.set(NAME, [HOST])
        self.events["ready"] = time.time()

    def stop(self) -> subprocess.CompletedProcess[str]:
        """As a pod stops: out of the records, the preStop drain, then SIGTERM."""
        assert self._proc is not None
        self._zone.set(NAME, [])
        self.events["unpublished"] = time.time()
        options = ["--settle-s", str(SETTLE_S), "--interval-s", "0.05",
                   "--timeout-s", str(DRAIN_TIMEOUT_S)]  # fmt: skip
        command = [sys.executable, "-m", "fairq", "k8s", "drain", "--url", self.url, *options]
        drained = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
        self.events["drained"] = time.time()
        self._proc.terminate()
        self._proc.wait(10)
        self._proc = None
        return drained

    def run(self, stop: threading.Event) -> None:
        """Poll every 0.1 s (pollingInterval, shortened) until ``stop``."""
        idle_since: float | None = None
        while not stop.wait(0.1):
            value = demand(self._metrics)
            if value is None:
                continue
            running = self._proc is not None
            wanted = 0 if value <= 0 else min(1, math.ceil(value / DEMAND_PER_REPLICA))
            if wanted and not running:
                self.start()
            elif running and not wanted:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= COOLDOWN_S:
                    self.stop()
                    idle_since = None
            else:
                idle_since = None


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[tuple[ScriptedKeda, Settings, str, str]]:
    """(the scripted autoscaler, fairq's settings, the gateway's URL, the dispatcher's
    metrics URL): a dispatcher and a worker for MODEL, whose replicas are NAME's records."""
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    groups = ProcessGroups()
    with dns_server() as (zone, nameserver):
        port = free_port()
        discovery = {"dns": NAME, "port": port, "interval_s": DISCOVERY_S,
                     "nameservers": [nameserver]}  # fmt: skip
        model = {"admission": "metrics", "endpoints": [], "discovery": discovery}
        config = make_config(quick=True, model_fields=model, status_interval_s=0.1)
        settings = make_settings(redis_url, **config, metrics_port=0)
        (tmp_path / "worker.yaml").write_text(yaml.safe_dump(config))
        env = {**os.environ, "FAIRQ_CONFIG": str(tmp_path / "worker.yaml"),
               "FAIRQ_REDIS_URL": redis_url, "FAIRQ_LOG_LEVEL": "WARNING",
               "FAIRQ_METRICS_PORT": "0"}  # fmt: skip
        try:
            groups.start([sys.executable, "-m", "fairq", "worker"], env=env)
            with (
                dispatcher_process(config, redis_url, tmp_path) as metrics,
                gateway(settings) as url,
            ):
                yield ScriptedKeda(groups, zone, metrics, profile, port), settings, url, metrics
        finally:
            groups.kill_all()


def job_view(url: str, job_id: str) -> dict[str, Any]:
    answer = local_http.get(f"{url}/v1/jobs/{job_id}", headers=ALICE, timeout=5)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def tokens_streamed(redis: Redis, job_id: str) -> int:
    entries = await redis.xrange(keys.results(MODEL, job_id))
    chunks = b"".join(f.get(CHUNK_FIELD, b"") for _, f in entries)
    return sum(
        1
        for line in chunks.split(b"\n\n")
        if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line
    )


async def submit(client: AsyncClient) -> str:
    prompt = [{"role": "user", "content": "hi"}]
    return await client.submit(MODEL, messages=prompt, max_tokens=TOKENS, stream=True)


async def status_endpoints(redis: Redis) -> list[str]:
    """The endpoints the dispatcher's last status snapshot shows (its live set)."""
    raw = await redis.get(keys.status(MODEL))
    return [] if raw is None else [row["url"] for row in orjson.loads(raw)["endpoints"]]


async def test_a_model_at_zero_wakes_on_its_first_request_and_goes_back_to_zero(
    cluster: tuple[ScriptedKeda, Settings, str, str], redis_url: str
) -> None:
    keda, settings, url, metrics = cluster
    alice = AsyncClient(settings, api_key=ALICE_KEY)
    redis = Redis.from_url(redis_url)
    stop = threading.Event()
    scaler = threading.Thread(target=keda.run, args=(stop,), daemon=True)
    try:
        job_id = await submit(alice)
        view = await aeventually(
            lambda: asyncio.to_thread(job_view, url, job_id),
            "the model at zero to show as starting",
            until=lambda v: v["model_state"] == "starting",
        )
        assert view["status"] == "queued" and view["queue_position"]["estimated_wait_s"] is None
        await aeventually(lambda: asyncio.to_thread(demand, metrics), "the demand KEDA reads",
                          until=lambda value: value == 1)  # fmt: skip
        scaler.start()
        record = await aeventually(
            lambda: alice.status(job_id),
            "the first request to be served",
            30,
            until=lambda r: r.state is JobState.COMPLETED,
        )
        assert record.endpoint == keda.url and record.attempts == 1
        assert await tokens_streamed(redis, job_id) == TOKENS
        assert record.first_token_ms is not None
        after_ready_s = record.first_token_ms / 1000 - keda.events["ready"]
        # One discovery read, one scrape, one dispatch round and one engine step.
        assert after_ready_s < DISCOVERY_S + 1.5, after_ready_s
        # Nothing queued or in flight: after the cooldown, back to zero, drained at once.
        await aeventually(lambda: keda.events, "the model to go back to zero", 30,
                          until=lambda events: "drained" in events)  # fmt: skip
        # A drain that waited for anything would take its whole --timeout-s; beyond the
        # settle, the rest is the drain command's interpreter starting (3.4 s once on a busy
        # machine, 6.3 s beside three other test processes on two cores).
        assert keda.events["drained"] - keda.events["unpublished"] < SETTLE_S + DRAIN_TIMEOUT_S / 2
        assert keda.events["unpublished"] - record.ended_ms / 1000 >= COOLDOWN_S
        assert await asyncio.to_thread(demand, metrics) == 0
    finally:
        stop.set()
        if scaler.is_alive():
            scaler.join(30)
        await alice.aclose()
        await redis.aclose()


async def test_a_replica_stopped_mid_answer_drains_it_whole_and_gets_nothing_new(
    cluster: tuple[ScriptedKeda, Settings, str, str], redis_url: str
) -> None:
    keda, settings, url, _ = cluster
    alice = AsyncClient(settings, api_key=ALICE_KEY)
    redis = Redis.from_url(redis_url)
    try:
        await asyncio.to_thread(keda.start)
        streaming = await submit(alice)
        await aeventually(
            lambda: alice.status(streaming),
            "the answer to start streaming",
            15,
            until=lambda r: r.first_token_ms is not None,
            interval_s=0.01,
        )
        # The first token can come before the status snapshot (every 0.1 s) shows the
        # replica found: a snapshot from before discovery shows no endpoint either, and
        # the wait below would pass on it while the dispatcher still sends to the replica.
        await aeventually(lambda: status_endpoints(redis), "the dispatcher to show the replica",
                          10, until=lambda urls: urls == [keda.url], interval_s=0.02)  # fmt: skip
        stopping = asyncio.create_task(asyncio.to_thread(keda.stop))  # a scale-down
        await aeventually(lambda: status_endpoints(redis), "the dispatcher to drop the replica",
                          10, until=lambda urls: urls == [], interval_s=0.02)  # fmt: skip
        assert not stopping.done(), "the drain waits for the answer still streaming"
        held = await submit(alice)  # while the replica drains: it must get nothing new
        drained = await stopping
        assert drained.returncode == 0, drained.stderr
        record = await alice.status(streaming)
        assert record.state is JobState.COMPLETED and record.attempts == 1
        assert await tokens_streamed(redis, streaming) == TOKENS  # whole: nothing cut
        assert record.ended_ms is not None
        assert record.ended_ms / 1000 <= keda.events["drained"]  # ended before the engine stopped
        view = await asyncio.to_thread(job_view, url, held)
        assert view["status"] == "queued" and view["model_state"] == "starting"
        assert (await alice.status(held)).endpoint is None
    finally:
        await alice.aclose()
        await redis.aclose()
