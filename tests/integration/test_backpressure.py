"""Metric-driven backpressure with real processes: fairq keeps the engine's own queue
at the band's target while a flood waits in fairq, where it can be reordered."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from broker import Client, JobState
from fairq.stack.processes import DEMO_MODELS
from tests.support import local_http
from tests.support.settings import make_settings
from tests.support.stack import demo_stack, sim_port

pytestmark = pytest.mark.integration

SMALL_ENGINE = {"max_num_seqs": 2, "step_base_ms": 5.0, "default_output_tokens": 16}


def engine_waiting(port: int) -> float:
    text = local_http.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_waiting":
                return sample.value
    raise AssertionError("no vllm:num_requests_waiting in the simulator's metrics")


class WaitingProbe:
    """Samples the engine's waiting queue every 20 ms in a thread, until stopped."""

    def __init__(self, port: int) -> None:
        self.samples: list[float] = []
        self._port = port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < deadline:
            self.samples.append(engine_waiting(self._port))
            time.sleep(0.02)

    def __enter__(self) -> WaitingProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def small_profile(tmp_path: Path) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL_ENGINE))
    return str(path)


def run_flood(redis_url: str, profile: str, model_overrides: dict[str, Any]) -> list[float]:
    """30 jobs of one user at once; returns the engine's waiting queue as sampled."""
    with demo_stack(
        per_model={DEMO_MODELS[0]: model_overrides},
        profile=profile,
        redis_url=redis_url,
        gateway=False,
    ) as stack:
        settings = make_settings(redis_url, **stack.config)
        probe = WaitingProbe(sim_port(stack, DEMO_MODELS[0]))
        with Client(settings, api_key="fq-demo-alice") as client, probe:
            prompt = [{"role": "user", "content": "hello"}]
            jobs = [
                client.submit(DEMO_MODELS[0], messages=prompt, max_tokens=12) for _ in range(30)
            ]
            for job_id in jobs:
                client.result(job_id)
            assert {client.status(j).state for j in jobs} == {JobState.COMPLETED}
    return probe.samples


@pytest.fixture
def flood(redis_url: str, small_profile: str) -> Iterator[Any]:
    yield lambda overrides: run_flood(redis_url, small_profile, overrides)


def test_backpressure_keeps_the_engine_queue_at_the_target_while_fairq_holds_the_rest(
    flood: Any,
) -> None:
    # The demo key queues in its first band, interactive: the target is set for that band.
    samples = flood({"queue_targets": {"interactive": 2, "default": 2}})
    assert len(samples) > 20
    ordered = sorted(samples)
    assert ordered[int(len(ordered) * 0.9)] <= 2  # the engine's queue stays at the target
    # A job handed to the engine between two samples may show for a moment before the
    # engine takes it into its batch; never the flood.
    assert max(samples) <= 3


def test_without_backpressure_the_flood_fills_the_engine_queue(flood: Any) -> None:
    samples = flood({"admission": "static", "inflight_cap": 1000})
    assert max(samples) >= 15  # the contrast: the same flood straight into the engine
