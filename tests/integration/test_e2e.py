"""End to end over HTTP with every component as its own process: the gateway,
dispatcher, worker and simulator against the session's real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairq.stack.localredis import LocalRedis
from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.stack import demo_stack, sim_port

pytestmark = pytest.mark.integration

AUTH = {"Authorization": "Bearer fq-demo-alice"}


@pytest.fixture(scope="module")
def stack(redis_server: LocalRedis) -> Iterator[Stack]:
    with demo_stack(redis_url=redis_server.url) as running:
        yield running


def aborted_at_engine(sim_port: int) -> float:
    text = local_http.get(f"http://127.0.0.1:{sim_port}/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "vllm:request_success_total"
                and sample.labels.get("finished_reason") == "abort"
            ):
                return sample.value
    raise AssertionError("the simulator reports no abort counter")


def test_a_client_that_leaves_mid_stream_cancels_its_job_and_the_engine_request(
    stack: Stack,
) -> None:
    port = sim_port(stack, DEMO_MODELS[0])
    before = aborted_at_engine(port)
    body = {"model": DEMO_MODELS[0], "stream": True, "max_tokens": 3000,
            "messages": [{"role": "user", "content": "a long answer please"}]}  # fmt: skip
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{stack.gateway_url}/v1/chat/completions",
                           json=body, headers=AUTH) as response:  # fmt: skip
            job_id = response.headers["x-fairq-job-id"]
            lines = response.iter_lines()
            received = [next(lines) for _ in range(6)]
            # Issue 37: the running stream's record shows when its first token came, not
            # only once it has ended.
            running = client.get(f"{stack.gateway_url}/v1/jobs/{job_id}", headers=AUTH).json()
        assert any(line.startswith("data: {") for line in received)
        assert running["status"] == "running", running
        assert running["first_token_at_ms"] is not None, running
        assert running["first_token_at_ms"] >= running["started_at_ms"]

        def status() -> str:
            job = client.get(f"{stack.gateway_url}/v1/jobs/{job_id}", headers=AUTH).json()
            return str(job["status"])

        eventually(
            lambda: status() == "cancelled" and aborted_at_engine(port) > before,
            "the job cancelled and the engine's request aborted",
            10,
            interval_s=0.1,
        )
        assert status() == "cancelled"
    assert aborted_at_engine(port) == before + 1  # the engine stopped generating


def test_status_and_cancel_of_a_job_through_the_api(stack: Stack) -> None:
    body = {"model": DEMO_MODELS[1], "prompt": "x", "max_tokens": 3}
    with httpx.Client(timeout=10) as client:
        response = client.post(f"{stack.gateway_url}/v1/completions", json=body, headers=AUTH)
        assert response.status_code == 200
        job_id = response.headers["x-fairq-job-id"]
        assert response.json()["id"] == f"cmpl-{job_id}"
        job = client.get(f"{stack.gateway_url}/v1/jobs/{job_id}", headers=AUTH).json()
        assert job["status"] == "completed" and job["usage"]["completion_tokens"] == 3
        assert job["first_token_at_ms"] >= job["started_at_ms"] >= job["dispatched_at_ms"]
        other = {"Authorization": "Bearer fq-demo-bob"}
        assert client.get(f"{stack.gateway_url}/v1/jobs/{job_id}", headers=other).status_code == 404
        assert (
            client.delete(f"{stack.gateway_url}/v1/jobs/{job_id}", headers=other).status_code == 404
        )
