"""The libraries whose internals fairq reads: each reach exists in the installed release,
and ``pyproject.toml`` bounds each such library from above.

A reach is a name the library does not document as API. A release that drops one
fails here by name, before the behaviour tests that depend on it (named beside each
reach) fail less legibly; the upper bound keeps such a release from being installed
until it has been tried.
"""

from __future__ import annotations

import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.asyncio.connection import RedisSSLContext
from rq import SimpleWorker
from uvicorn import Server
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway import body_writer
from tests.support.paths import REPO

# (distribution, what is read, where, the test that shows the behaviour depends on it);
# kept as a table, one reach per row.
REACHES = [
    ("uvicorn", "RequestResponseCycle's transport, flow, disconnected, chunked_encoding",
     "gateway/body_writer.py", "tests/gateway/test_body_writer.py"),
    ("uvicorn", "Server.main_loop and on_tick, overridden", "broker/process/uvicorn_server.py",
     "tests/broker/test_uvicorn_server.py"),
    ("uvicorn", "HttpToolsProtocol's parser callbacks, overridden; its loop, connections, "
     "transport, flow.read_paused, cycle (response_started, response_complete, disconnected)",
     "gateway/connections.py", "tests/gateway/test_connections.py"),
    ("redis", "RedisCluster._determine_slot, overridden", "broker/redis/cluster.py",
     "tests/integration/test_cluster.py"),
    ("redis", "ClusterPipeline._execution_strategy._command_queue", "broker/redis/cluster.py",
     "tests/integration/test_cluster.py"),
    ("redis", "RedisSSLContext.__slots__ (the TLS options of a URL)", "broker/redis/resp.py",
     "tests/gateway/test_security.py"),
    ("redis", "Pipeline.scripts (loaded before the pipeline runs)", "broker/lua/__init__.py",
     "tests/broker/test_scripts.py"),
    ("rq", "SimpleWorker.run_maintenance_tasks, overridden", "batch/worker.py",
     "tests/integration/test_batch_api.py"),
]  # fmt: skip


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    parsed = (Requirement(line) for line in project["dependencies"])
    return {r.name: r for r in parsed}


@pytest.mark.parametrize("distribution", sorted({reach[0] for reach in REACHES}))
def test_a_library_whose_internals_are_read_is_bounded_above(distribution: str) -> None:
    requirement = _requirements()[distribution]
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier), (
        f"pyproject.toml: {requirement} has no upper bound"
    )
    assert requirement.specifier.contains(metadata.version(distribution)), (
        f"the installed {distribution} {metadata.version(distribution)} is outside {requirement}"
    )


def test_every_reach_names_an_existing_file_and_test() -> None:
    for _, _, where, test in REACHES:
        assert (REPO / where).is_file(), where
        assert (REPO / test).is_file(), test


def test_uvicorn_cycle_has_what_the_body_writer_reads() -> None:
    names = set(RequestResponseCycle.__init__.__code__.co_names)
    for name in (*body_writer._USED, "chunked_encoding"):
        assert name in names, f"uvicorn's RequestResponseCycle no longer sets {name}"


def test_uvicorn_protocol_has_what_the_connection_limits_override_and_read() -> None:
    for method in (
        "connection_made",
        "connection_lost",
        "data_received",
        "on_message_begin",
        "on_headers_complete",
        "on_body",
        "on_message_complete",
    ):
        assert callable(getattr(HttpToolsProtocol, method)), method
    protocol = set(HttpToolsProtocol.__init__.__code__.co_names)
    assert {"loop", "connections", "transport", "flow", "cycle"} <= protocol
    assert "read_paused" in FlowControl.__init__.__code__.co_names
    cycle = set(RequestResponseCycle.__init__.__code__.co_names)
    assert {"response_started", "response_complete", "disconnected"} <= cycle


def test_uvicorn_server_has_the_loop_fairq_overrides() -> None:
    assert callable(Server.main_loop) and callable(Server.on_tick)


def test_redis_cluster_has_what_fairq_overrides_and_reads() -> None:
    assert callable(RedisCluster._determine_slot)
    assert "_execution_strategy" in ClusterPipeline.__init__.__code__.co_names
    assert "context" in RedisSSLContext.__slots__ and len(RedisSSLContext.__slots__) > 1


async def test_redis_pipeline_keeps_the_scripts_to_load_before_it_runs() -> None:
    from redis.asyncio import Redis

    pipe = Redis().pipeline()  # no connection is made until the pipeline runs
    assert isinstance(pipe.scripts, set)


def test_rq_worker_has_the_maintenance_hook_fairq_overrides() -> None:
    assert callable(SimpleWorker.run_maintenance_tasks)
