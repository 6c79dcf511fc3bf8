"""fairq's components on one host, each started as an operator starts it by hand: with
no metrics setting, every one serves ``/metrics`` (a port per kind, a second of a kind
on a free port it names), and only on loopback unless ``metrics_host`` says otherwise;
the gateway, given ``http.metrics_port``, there and not on its HTTP port; at
``FAIRQ_LOG_LEVEL=WARNING`` no process prints a line below WARNING, a library's included
(RQ's scheduler lock, its registry cleaning)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from broker.telemetry import METRICS_PORTS
from fairq.stack.localredis import free_port
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.processes import ProcessGroups
from tests.support.settings import make_config

pytestmark = pytest.mark.integration

_SERVING = re.compile(r"serving /metrics on ([\d.]+):(\d+)")
_SETTLE_S = 4.0  # the batch worker's maintenance (its scheduler lock) runs every second
# A series each kind exports from its first scrape.
_SERIES = {
    "dispatcher": "fairq_dispatched",
    "worker": "fairq_worker_concurrency",
    "batch-worker": "fairq_batch_requests",
}


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    config = tmp_path / "fairq.yaml"
    config.write_text(yaml.safe_dump(make_config()))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    return clean | {"FAIRQ_CONFIG": str(config), "FAIRQ_REDIS_URL": redis_url}


def _start(processes: ProcessGroups, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return processes.start(
        [sys.executable, "-m", "fairq", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(process: subprocess.Popen[str]) -> str:
    os.killpg(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    return str(output)


def _listening(pid: int, port: int) -> str | None:
    """The address the process ``pid`` listens on at ``port`` (None: it does not)."""
    sockets = psutil.Process(pid).net_connections(kind="inet")
    return next(
        (s.laddr.ip for s in sockets if s.status == "LISTEN" and s.laddr.port == port), None
    )


def test_components_with_default_settings_on_one_host_each_serve_metrics_on_loopback(
    env: dict[str, str], processes: ProcessGroups
) -> None:
    kinds = ["dispatcher", "worker", "batch-worker", "worker"]  # two workers: one collides
    started = [(kind, _start(processes, env | {"FAIRQ_LOG_LEVEL": "INFO"}, kind)) for kind in kinds]
    served: list[tuple[str, int, psutil.Process]] = []
    for kind, process in started:
        line = process.stdout.readline() if process.stdout else ""
        while line and "/metrics" not in line:
            line = process.stdout.readline() if process.stdout else ""
        found = _SERVING.search(line)
        assert found, f"{kind} said no metrics port: {line!r}"
        host, port = found[1], int(found[2])
        assert host == "127.0.0.1"
        own = METRICS_PORTS[kind.replace("-", " ")]
        # Its own port, unless another process on this host holds it: then it says so.
        assert port == own or f"own port {own} is taken" in line, line
        served.append((kind, port, psutil.Process(process.pid)))
    ports = [port for _, port, _ in served]
    assert len(set(ports)) == len(ports)
    for kind, port, process in served:
        text = local_http.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text
        assert _SERIES[kind] in text, kind
        assert _listening(process.pid, port) == "127.0.0.1", kind
    for _, process in started:
        _stop(process)


def test_metrics_host_and_port_when_set_are_where_a_component_listens(
    env: dict[str, str], processes: ProcessGroups
) -> None:
    port = free_port()
    settings = {"FAIRQ_METRICS_HOST": "0.0.0.0", "FAIRQ_METRICS_PORT": str(port)}
    worker = _start(processes, env | settings, "worker")

    def listening() -> str | None:
        return _listening(worker.pid, port)

    assert eventually(listening, "the worker listens on its metrics port", 30.0) == "0.0.0.0"
    assert "fairq_worker_concurrency" in local_http.get(f"http://127.0.0.1:{port}/metrics").text
    _stop(worker)


def test_the_gateway_serves_metrics_on_its_own_port_when_set_and_then_not_on_http(
    env: dict[str, str], processes: ProcessGroups
) -> None:
    # As the Kubernetes manifests run it: clients reach the HTTP port, monitoring the other.
    api_port, metrics_port = free_port(), free_port()
    settings = {"FAIRQ_HTTP__METRICS_PORT": str(metrics_port), "FAIRQ_LOG_LEVEL": "WARNING"}
    gateway = _start(processes, env | settings, "api", "--port", str(api_port))
    _answers(f"http://127.0.0.1:{api_port}/readyz")
    own = local_http.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5.0)
    assert own.status_code == 200 and "fairq_jobs_submitted" in own.text
    assert _listening(gateway.pid, metrics_port) == "127.0.0.1"  # metrics_host's default
    public = local_http.get(f"http://127.0.0.1:{api_port}/metrics", timeout=5.0)
    assert public.status_code == 404 and "fairq_jobs_submitted" not in public.text
    _stop(gateway)


def test_at_warning_no_process_prints_a_line_below_it(
    env: dict[str, str], processes: ProcessGroups
) -> None:
    quiet = env | {"FAIRQ_LOG_LEVEL": "WARNING", "FAIRQ_METRICS_PORT": "0"}
    sim_port, api_port = free_port(), free_port()
    commands: dict[str, tuple[str, ...]] = {
        "dispatcher": ("dispatcher",),
        "worker": ("worker",),
        "batch-worker": ("batch-worker",),
        "api": ("api", "--port", str(api_port)),
        "sim": ("sim", "--port", str(sim_port), "--model", "m"),
    }
    started = {name: _start(processes, quiet, *args) for name, args in commands.items()}
    _answers(f"http://127.0.0.1:{api_port}/readyz")
    _answers(f"http://127.0.0.1:{sim_port}/v1/models")
    time.sleep(_SETTLE_S)
    for name, process in started.items():
        output = _stop(process)
        below = [line for line in output.splitlines() if _below_warning(line)]
        assert not below, f"{name} printed {below}"


def _answers(url: str) -> None:
    def status() -> int:
        return local_http.get(url, timeout=1.0).status_code

    eventually(status, f"{url} answers 200", 30.0, until=lambda code: code == 200,
               interval_s=0.1, ignoring=(httpx.HTTPError,))  # fmt: skip


def _below_warning(line: str) -> bool:
    """fairq's format (``... INFO name: message``), RQ's own, uvicorn's (``INFO:``)."""
    return bool(re.search(r"\b(INFO|DEBUG)\b", line)) or "Acquired scheduler lock" in line
