"""The operator's view in pieces: queue reads, snapshots, history, the admin routes, the
CLI's job inspection, and the Grafana dashboard's series (real Redis, real HTTP)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from broker import (
    DISPATCH_RATE_WINDOW_S,
    DispatchStore,
    ExecutionStore,
    JobQueue,
    JobState,
    Latency,
    Outcome,
    Pick,
    RequestKind,
    Settings,
    StreamMode,
    Submission,
    keys,
)
from broker.status import ModelQueues, read_queues, read_status
from dispatcher.publisher import (
    HISTORY_STEP_S,
    DispatcherCollector,
    ModelStatus,
    StatusPublisher,
    _History,
)
from dispatcher.service import Dispatcher
from fairq.cli import main
from tests.support.paths import REPO
from tests.support.settings import (
    ADMIN_KEY,
    ALICE_KEY,
    ENDPOINT,
    MODEL,
    api_key,
    make_config,
    make_settings,
)
from tests.support.stack import gateway
from workers.telemetry import WorkerCollector, WorkerTelemetry

CONFIG = make_config(
    api_keys=[api_key(ADMIN_KEY, "root", admin=True), api_key(ALICE_KEY, "alice")],
    metrics_port=0,
    status_top_users=2,
)
_DASHBOARD = REPO / "deploy/k8s/grafana/fairq-dashboard.json"


def submission(user: str, band: str = "default") -> Submission:
    return Submission(
        model=MODEL, owner=user, user=user, tenant=user, band=band,
        kind=RequestKind.CHAT, stream_flag=StreamMode.STREAMED, payload=b"{}",
    )  # fmt: skip


async def _queue(aredis: Redis, s: Settings, jobs: dict[tuple[str, str], int]) -> list[str]:
    queue = JobQueue(aredis, s)
    return [
        await queue.submit(submission(user, band))
        for (user, band), n in jobs.items()
        for _ in range(n)
    ]


async def test_read_queues_counts_each_band_and_ranks_the_top_users(
    aredis: Redis, redis_url: str
) -> None:
    s = make_settings(redis_url, **CONFIG)
    await _queue(aredis, s, {("alice", "default"): 4, ("bob", "default"): 1,
                             ("carol", "default"): 2, ("dave", "batch"): 3})  # fmt: skip
    queues = await read_queues(aredis, MODEL, s.bands, top=2)
    by_band = {b.band: b for b in queues.bands}
    assert by_band["default"].queued == 7 and by_band["default"].backlogged_users == 3
    assert by_band["default"].top_users == [("alice", 4), ("carol", 2)]  # top 2 of 3
    assert by_band["batch"].top_users == [("dave", 3)]
    assert by_band["interactive"].queued == 0 and by_band["interactive"].top_users == []
    assert queues.inflight == {} and queues.in_engine == []


async def test_the_dispatch_rate_decays_over_its_window_once_dispatching_stops(
    aredis: Redis, redis_url: str
) -> None:
    # dispatch.lua stores the rate only when it dispatches: an idle model kept its last.
    s = make_settings(redis_url, **CONFIG)
    window_ms = int(DISPATCH_RATE_WINDOW_S * 1000)
    for age_ms, shown in ((0, 4.0), (window_ms // 2, 2.0), (window_ms + 1000, 0.0)):
        stored_ms = int(time.time() * 1000) - age_ms
        await aredis.hset(keys.meta(MODEL), mapping={"rate": "4.0", "rate_ms": stored_ms})
        queues = await read_queues(aredis, MODEL, s.bands, top=0)
        assert queues.dispatch_rate == pytest.approx(shown, abs=0.05), age_ms
    await aredis.hdel(keys.meta(MODEL), "rate", "rate_ms")
    assert (await read_queues(aredis, MODEL, s.bands, top=0)).dispatch_rate is None


async def test_status_without_a_snapshot_shows_replicas_found_through_dns_that_have_jobs(
    aredis: Redis, redis_url: str
) -> None:
    found = {"dns": "engine-m1.fairq.svc.cluster.local", "port": 8000}
    s = make_settings(redis_url, model_fields={"endpoints": [], "discovery": found})
    await aredis.hset(keys.inflight(MODEL), "http://10.1.0.4:8000", 2)
    (view,) = await read_status(aredis, s, now_ms=1)
    assert [(e["url"], e["inflight"]) for e in view["endpoints"]] == [  # type: ignore[index, union-attr]
        ("http://10.1.0.4:8000", 2)
    ]


async def test_status_without_a_snapshot_reads_the_queues_and_with_one_returns_it(
    aredis: Redis, redis_url: str
) -> None:
    s = make_settings(redis_url, **CONFIG)
    await _queue(aredis, s, {("alice", "interactive"): 2})
    (view,) = await read_status(aredis, s, now_ms=1)
    assert view["source"] == "redis" and view["endpoints"][0]["healthy"] is None  # type: ignore[index]
    assert view["bands"][0] == {  # type: ignore[index]
        "band": "interactive", "queued": 2, "backlogged_users": 1,
        "top_users": [{"user": "alice", "queued": 2}],
    }  # fmt: skip
    published = {"model": MODEL, "source": "dispatcher", "endpoints": [], "bands": []}
    await aredis.set(keys.status(MODEL), orjson.dumps(published), ex=keys.STATUS_TTL_S)
    assert await read_status(aredis, s, now_ms=1) == [published]


def test_history_makes_one_point_per_step_with_ttft_quantiles() -> None:
    history = _History()
    first = [Latency("default", 5, ttft) for ttft in (10, 20, 30, 40)] + [Latency("b", 1, None)]
    history.add(100.0, 1000, 3, first)
    history.add(100.5, 1500, 4, [Latency("default", 7, 50)])  # within the step: pending
    assert [p[:6] for p in history.points] == [[1000, 3, 30.0, 40.0, 5, 5]]
    history.add(100.0 + HISTORY_STEP_S, 3000, 0, [])
    assert list(history.points)[-1] == [3000, 0, 50.0, 50.0, 7, 1]
    history.add(100.0 + 2 * HISTORY_STEP_S, 5000, 0, [])
    assert list(history.points)[-1] == [5000, 0, None, None, None, 0]


def test_admin_status_answers_admin_keys_only_and_the_page_and_metrics_are_served(
    redis_url: str,
) -> None:
    with gateway(make_settings(redis_url, **CONFIG)) as url, httpx.Client() as client:
        assert client.get(f"{url}/admin/status").status_code == 404
        refused = client.get(f"{url}/admin/status", headers={"Authorization": "Bearer k-alice"})
        assert refused.status_code == 404  # as an unknown URL (tests/gateway/test_security.py)
        ok = client.get(f"{url}/admin/status", headers={"Authorization": "Bearer k-admin"})
        assert ok.status_code == 200
        assert [m["model"] for m in ok.json()["models"]] == [MODEL]
        page = client.get(f"{url}/dashboard")
        assert page.status_code == 200 and "/admin/status" in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert "http" not in re.sub(r"https?://www\.w3\.org", "", page.text).split("<script>")[1]
        metrics = client.get(f"{url}/metrics")
        assert metrics.status_code == 200 and "process_cpu_seconds_total" in metrics.text


async def _queue_apart(redis_url: str, jobs: dict[tuple[str, str], int]) -> list[str]:
    redis = Redis.from_url(redis_url)
    try:
        return await _queue(redis, make_settings(redis_url, **CONFIG), jobs)
    finally:
        await redis.aclose()


def test_fairq_jobs_and_job_show_any_users_jobs(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The commands run their own event loop: this test has none.
    alice = asyncio.run(_queue_apart(redis_url, {("alice", "default"): 2}))
    asyncio.run(_queue_apart(redis_url, {("bob", "batch"): 1}))
    config = tmp_path / "fairq.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    monkeypatch.setenv("FAIRQ_CONFIG", str(config))
    monkeypatch.setenv("FAIRQ_REDIS_URL", redis_url)
    runner = CliRunner()
    listed = runner.invoke(main, ["jobs", "--json", "--user", "alice"])
    assert listed.exit_code == 0, listed.output
    assert sorted(j["id"] for j in json.loads(listed.output)) == sorted(alice)
    everyone = json.loads(runner.invoke(main, ["jobs", "--json", "--limit", "2"]).output)
    assert len(everyone) == 2
    shown = runner.invoke(main, ["job", alice[0]])
    assert shown.exit_code == 0, shown.output
    record = json.loads(shown.output)
    assert record["user"] == "alice" and record["status"] == "queued"
    assert record["queue_position"]["jobs_ahead"] == 0
    missing = runner.invoke(main, ["job", "nope"])
    assert missing.exit_code == 1 and "no job" in missing.output


def _exported_names() -> set[str]:
    """Every series name fairq's components export (with histogram and counter suffixes)."""
    queues = ModelQueues(MODEL, [], {}, {}, [], None)
    endpoint = {"url": "u", "healthy": True, "tpot_ms": 1.0, "admission": {}}

    class _Publisher:
        latest = {MODEL: ModelStatus(queues, [endpoint])}
        quotas: list[object] = []

    collectors = [
        REGISTRY,
        DispatcherCollector(_Publisher()),  # type: ignore[arg-type]
        WorkerCollector([MODEL], list, 1),
    ]
    return {s.name for c in collectors for f in c.collect() for s in f.samples} | {
        f.name for c in collectors for f in c.collect()
    }


def test_every_series_of_the_grafana_dashboard_is_exported() -> None:
    dashboard = json.loads(_DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\bfairq_[a-z_]+", e)}
    names = _exported_names()
    # Counters and histograms without a sample yet export no series; their families do.
    bases = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used}
    missing = {n for n in bases if n not in names and f"{n}_total" not in names}
    assert not missing, f"the dashboard uses series nobody exports: {sorted(missing)}"
    assert len(used) >= 15


async def _serve_newcomer(redis_url: str) -> dict[str, object]:
    """bob's one streamed job goes the whole way (dispatched while he had nothing in the
    engine, first token, completed, timed by the worker's telemetry), then a dispatcher
    publishes the model's status; returns that snapshot."""
    s = make_settings(redis_url, **CONFIG)
    redis = Redis.from_url(redis_url)
    try:
        (job_id,) = await _queue(redis, s, {("bob", "default"): 1})
        await DispatchStore(redis, s).dispatch(
            MODEL, ENDPOINT, 10, [Pick("default", "bob", 1, 0)], 10
        )
        x = ExecutionStore(redis, s)
        await x.ensure_groups([MODEL])
        (claimed,) = await x.claim(redis, [MODEL], "w1", count=1, block_ms=100)
        await x.start(claimed, "w1")
        await asyncio.sleep(0.05)  # bob's time to first token: at least this
        outcome = Outcome(JobState.COMPLETED, first_token_ms=int(time.time() * 1000))
        await x.load_scripts()
        pipe = x.pipeline()
        x.add_first(pipe, MODEL, job_id)
        x.add_complete(pipe, claimed, outcome)
        await pipe.execute()
        telemetry = WorkerTelemetry()
        telemetry.ended(claimed, outcome)
        assert await telemetry.observe(redis) == 1
        snapshot = await StatusPublisher(s, redis, Dispatcher(s, redis)).publish(s.models[0])
        return snapshot.public()
    finally:
        await redis.aclose()


def test_a_newcomers_time_to_first_token_shows_in_the_status_and_fairq_status_json(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    published = asyncio.run(_serve_newcomer(redis_url))  # the commands run their own loop
    newcomers = published["newcomer_ttft_ms"]
    assert isinstance(newcomers, dict) and newcomers["jobs"] == 1
    assert newcomers["p50"] == newcomers["p95"] and 50 <= newcomers["p50"] < 5000
    config = tmp_path / "fairq.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    monkeypatch.setenv("FAIRQ_CONFIG", str(config))
    monkeypatch.setenv("FAIRQ_REDIS_URL", redis_url)
    shown = CliRunner().invoke(main, ["status", "--json"])
    assert shown.exit_code == 0, shown.output
    (model,) = json.loads(shown.output)["models"]
    assert model["newcomer_ttft_ms"] == newcomers
    text = CliRunner().invoke(main, ["status"])
    assert f"newcomer TTFT p50 {newcomers['p50']:.0f} ms" in text.output
