"""The whole stack on a real 3-master Redis Cluster, with models spread over the shards.

The cluster is three nodes of the same server binary the other tests use, each in
cluster mode on its own loopback port (``fairq.stack.localcluster``). The stack runs as
production does (gateway, two dispatchers sharing the models by lease, two workers
serving every model), pointed at one node with ``FAIRQ_REDIS_CLUSTER=true``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis
from redis.crc import key_slot

from broker import keys
from broker.redis.cluster import node_url, slot_groups, slot_of
from broker.redis.connect import connect
from fairq.stack.localcluster import LocalCluster
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack, demo_config
from gateway.restarts import RestartWatch, restarted
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.settings import make_settings
from tests.support.stack import metric, sim_port

pytestmark = pytest.mark.integration

PER_SHARD = 2  # models whose keys live on each master
JOBS_PER_MODEL = 4  # half streamed through the openai client, half not through httpx


def models_over(cluster: LocalCluster) -> list[str]:
    """Model names chosen so that each master serves ``PER_SHARD`` of them."""
    picked: list[list[str]] = [[] for _ in cluster.slot_ranges()]
    for i in itertools.count():
        name = f"model-{i}"
        slot = key_slot(keys.ready(name).encode())
        shard = next(n for n, (lo, hi) in enumerate(cluster.slot_ranges()) if lo <= slot <= hi)
        if len(picked[shard]) < PER_SHARD:
            picked[shard].append(name)
        if all(len(names) == PER_SHARD for names in picked):
            return [name for names in picked for name in names]
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(masters=3) as running:
        yield running


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    models = models_over(cluster)
    sim_ports = [free_port(), free_port()]
    endpoints = {m: sim_ports[i % 2] for i, m in enumerate(models)}
    config = demo_config(sim_ports, models=[
        {"name": m, "engine": "vllm", "endpoints": [f"http://127.0.0.1:{endpoints[m]}"]}
        for m in models
    ])  # fmt: skip
    sims = {port: ",".join(m for m in models if endpoints[m] == port) for port in sim_ports}
    logs = tmp_path_factory.mktemp("cluster-logs")
    with Stack(
        config, gateway_port=free_port(), sims=sims, redis_url=cluster.url, dispatchers=2,
        workers=2, batch_workers=0, env={"FAIRQ_REDIS_CLUSTER": "true"}, log_dir=logs,
    ) as running:  # fmt: skip
        yield running


def logged(stack: Stack) -> str:
    assert stack.log_dir is not None
    return "\n".join(path.read_text(errors="replace") for path in stack.log_dir.glob("*.log"))


async def streamed(client: openai.AsyncOpenAI, model: str) -> tuple[str, str]:
    stream = await client.chat.completions.create(
        model=model, stream=True, max_tokens=12,
        messages=[{"role": "user", "content": f"hello {model}"}],
    )  # fmt: skip
    text, finish = "", ""
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    return text, finish


async def plain(http: httpx.AsyncClient, model: str) -> httpx.Response:
    body = {"model": model, "prompt": f"hi {model}", "max_tokens": 5}
    return await http.post("/v1/completions", json=body)


async def submit_everywhere(stack: Stack, models: list[str]) -> tuple[list[object], list[object]]:
    auth = {"Authorization": "Bearer fq-demo-alice"}
    async with (
        openai.AsyncOpenAI(base_url=f"{stack.gateway_url}/v1", api_key="fq-demo-alice",
                           max_retries=0, timeout=30) as client,
        httpx.AsyncClient(base_url=stack.gateway_url, headers=auth, timeout=30) as http,
    ):  # fmt: skip
        half = JOBS_PER_MODEL // 2
        streams = [streamed(client, m) for m in models for _ in range(half)]
        plains = [plain(http, m) for m in models for _ in range(half)]
        results = await asyncio.gather(*streams, *plains, return_exceptions=True)
    return list(results[: len(streams)]), list(results[len(streams) :])


def keys_per_node(cluster: LocalCluster, models: list[str]) -> dict[int, set[str]]:
    """Port -> the models having keys on that node (each node scanned on its own)."""
    found: dict[int, set[str]] = {}
    for port in cluster.ports:
        with redis.Redis(port=port) as node:
            names = {key.decode() for key in node.scan_iter(match="fq:{*", count=1000)}
        found[port] = {m for m in models if any(k.startswith(f"fq:{{{m}}}:") for k in names)}
    return found


def test_every_model_completes_on_a_three_master_cluster_without_crossslot(
    stack: Stack, cluster: LocalCluster
) -> None:
    models = [m["name"] for m in stack.config["models"]]
    assert len(models) >= 6
    assert stack.dead() is None, logged(stack)[-3000:]

    streams, plains = asyncio.run(submit_everywhere(stack, models))

    failures = [r for r in [*streams, *plains] if isinstance(r, BaseException)]
    assert not failures, failures[:3]
    for text, finish in streams:  # type: ignore[misc]
        assert text and finish == "length"
    for response in plains:
        assert isinstance(response, httpx.Response)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 5
    served = {r.json()["model"] for r in plains if isinstance(r, httpx.Response)}
    assert served == set(models)

    # Each master holds the keys of exactly the models whose slots it serves.
    per_node = keys_per_node(cluster, models)
    for port, (lo, hi) in zip(cluster.ports, cluster.slot_ranges(), strict=True):
        mine = {m for m in models if lo <= key_slot(keys.ready(m).encode()) <= hi}
        assert per_node[port] == mine and len(mine) == 2

    # Both dispatchers and both workers ran against the cluster without a cross-slot
    # command (redis-py refuses one client-side; a node would answer CROSSSLOT).
    text = logged(stack)
    assert stack.dead() is None, text[-4000:]
    assert "CROSSSLOT" not in text
    assert "all keys must map to the same key slot" not in text
    assert "Traceback" not in text


def test_each_job_is_inspectable_through_the_gateway_on_a_cluster(stack: Stack) -> None:
    auth = {"Authorization": "Bearer fq-demo-alice"}
    model = stack.config["models"][-1]["name"]
    with httpx.Client(base_url=stack.gateway_url, headers=auth, timeout=30) as http:
        response = http.post("/v1/completions", json={"model": model, "prompt": "x",
                                                      "max_tokens": 3})  # fmt: skip
        assert response.status_code == 200, response.text
        job = http.get(f"/v1/jobs/{response.headers['x-fairq-job-id']}").json()
    assert job["status"] == "completed" and job["model"] == model


def aborted_at_engine(sim_port: int, model: str) -> float:
    url = f"http://127.0.0.1:{sim_port}"
    return metric(url, "vllm:request_success_total", model_name=model, finished_reason="abort")


def test_a_cancel_published_on_one_master_reaches_the_worker_subscribed_on_another(
    stack: Stack,
) -> None:
    # A worker subscribes through the node of its first model's slot; the last model's
    # keys (and cancel.lua's PUBLISH) are on another master: the bus must carry it.
    models = [m["name"] for m in stack.config["models"]]
    model = models[-1]
    assert slot_of(model) != slot_of(models[0])
    port = sim_port(stack, model)
    before = aborted_at_engine(port, model)
    auth = {"Authorization": "Bearer fq-demo-alice"}
    body = {"model": model, "stream": True, "max_tokens": 3000,
            "messages": [{"role": "user", "content": "a long answer please"}]}  # fmt: skip
    with httpx.Client(base_url=stack.gateway_url, headers=auth, timeout=10) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            job_id = response.headers["x-fairq-job-id"]
            lines = response.iter_lines()
            assert any(next(lines).startswith("data: {") for _ in range(6))
        # The client left mid-stream: the gateway cancels the job, the worker its call.
        eventually(
            lambda: aborted_at_engine(port, model) != before,
            "the abort at the engine",
            10,
            interval_s=0.1,
        )
        assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
    assert aborted_at_engine(port, model) == before + 1


def test_the_operator_status_reads_every_model_over_the_cluster(stack: Stack) -> None:
    models = {m["name"] for m in stack.config["models"]}
    auth = {"Authorization": "Bearer fq-demo-bob"}
    with httpx.Client(base_url=stack.gateway_url, headers=auth, timeout=30) as http:
        for model in models:  # a job of each model to list
            body = {"model": model, "prompt": "x", "max_tokens": 2}
            assert http.post("/v1/completions", json=body).status_code == 200
    run = subprocess.run(
        [sys.executable, "-m", "fairq", "status", "--json"],
        env=stack.env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    listed = {m["model"] for m in json.loads(run.stdout)["models"]}
    assert listed == models
    jobs = subprocess.run(
        [sys.executable, "-m", "fairq", "jobs", "--json", "--user", "bob", "--limit", "500"],
        env=stack.env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert {job["model"] for job in json.loads(jobs.stdout)} == models  # scanned every master


def test_the_batch_api_says_it_needs_a_single_redis(stack: Stack) -> None:
    auth = {"Authorization": "Bearer fq-demo-alice"}
    files = {"file": ("in.jsonl", b"{}\n", "application/jsonl")}
    response = local_http.post(f"{stack.gateway_url}/v1/files", headers=auth, files=files,
                          data={"purpose": "batch"}, timeout=10)  # fmt: skip
    assert response.status_code == 501
    error = response.json()["error"]
    assert error["code"] == "batch_needs_single_redis" and "redis_cluster" in error["message"]


def test_models_are_grouped_by_slot_only_on_a_cluster() -> None:
    models = ["a", "b", "c", "d"]
    assert slot_groups(models, cluster=False) == [models]
    groups = slot_groups(models, cluster=True)
    assert sorted(m for g in groups for m in g) == models
    assert all(len({slot_of(m) for m in group}) == 1 for group in groups)
    assert len(groups) == len({slot_of(m) for m in models})


def test_a_node_url_keeps_credentials_scheme_and_options() -> None:
    url = "rediss://user:secret@seed.example:6379/0?ssl_cert_reqs=none"
    assert node_url(url, "10.0.0.7", 7001) == (
        "rediss://user:secret@10.0.0.7:7001/0?ssl_cert_reqs=none"
    )
    assert node_url("redis://127.0.0.1:1/0", "127.0.0.1", 2) == "redis://127.0.0.1:2/0"


async def test_the_restart_watch_reads_every_masters_run_id(cluster: LocalCluster) -> None:
    settings = make_settings(cluster.url, redis_cluster=True)
    client = connect(settings)
    try:
        run_ids = await RestartWatch(client, {}).run_ids()
    finally:
        await client.aclose()
    assert len(run_ids) == len(cluster.ports)  # one per master, not the default node only
    assert len(set(run_ids.values())) == len(cluster.ports)


def test_a_restart_is_a_run_id_that_changed_or_a_master_that_came_or_went() -> None:
    before = {"a:1": "r1", "b:2": "r2"}
    assert not restarted(None, before)  # the first read: nothing to compare with
    assert not restarted(before, dict(before))
    assert restarted(before, {"a:1": "r1", "b:2": "r9"})  # b restarted
    assert restarted(before, {"a:1": "r1", "c:3": "r3"})  # b failed over to c
    assert restarted(before, {"a:1": "r1"})  # b left
