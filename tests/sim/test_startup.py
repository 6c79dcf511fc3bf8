"""``fairq sim --startup-s``: a simulated pod that takes that long to start, as a vLLM pod
loading its weights: every route answers 503 until then (so a readiness probe and fairq's
scraper see it not ready), then it serves. A real ``fairq sim`` process on 127.0.0.1."""

from __future__ import annotations

import os
import sys
import time

import httpx
import pytest

from fairq.stack.localredis import free_port
from sim import SimProfile, create_app
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.processes import ProcessGroups

STARTUP_S = 2.0
MODEL = "m"
COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}


def test_a_pod_refuses_every_route_while_it_starts_then_serves(
    processes: ProcessGroups,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["sim", "--port", str(port), "--model", MODEL]
    env = {**os.environ, "FAIRQ_SIM_STARTUP_S": str(STARTUP_S), "FAIRQ_LOG_LEVEL": "WARNING"}
    started = time.monotonic()
    proc = processes.start([sys.executable, "-m", "fairq", *args], env=env)

    def listening() -> bool:
        assert proc.poll() is None, "the simulator exited"
        return local_http.get(f"{url}/health", timeout=1).status_code == 503

    eventually(listening, "the simulator to listen", 10.0, ignoring=(httpx.TransportError,))
    with httpx.Client(base_url=url, timeout=2) as client:
        assert client.get("/metrics").status_code == 503
        refused = client.post("/v1/completions", json=COMPLETION)
        assert refused.status_code == 503
        assert "starting" in refused.json()["error"]["message"]
        assert client.get("/v1/models").status_code == 503

        def ready() -> bool:
            return client.get("/health").status_code == 200

        eventually(ready, "the simulator to be ready", STARTUP_S + 10.0, interval_s=0.02)
        ready_after = time.monotonic() - started
        assert ready_after >= STARTUP_S  # not before its start-up ends
        assert "vllm:num_requests_waiting" in client.get("/metrics").text
        answer = client.post("/v1/completions", json=COMPLETION)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("startup_s", [-1.0, float("nan")])
def test_a_negative_start_up_is_refused(startup_s: float) -> None:
    with pytest.raises(ValueError, match="startup_s"):
        create_app([MODEL], SimProfile(), startup_s=startup_s)
