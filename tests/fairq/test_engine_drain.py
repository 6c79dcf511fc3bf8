"""The engine pod's preStop drain (``fairq k8s drain`` and the standalone script an init
container installs) against a real ``fairq sim`` process: it returns only after a
running stream ended, at once on an idle engine, and says when it gave up."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from fairq.k8s.drain import MetricsUnreadable, requests_in
from fairq.stack.localredis import free_port
from tests.support.paths import FIXTURES
from tests.support.processes import ProcessGroups
from tests.support.stack import wait_healthy

MODEL = "m1"
# One token per 40 ms: a 150-token answer streams for about 6 s, longer than the drain
# command's interpreter takes to start on a loaded machine (2.5 s seen beside the other
# test processes; with 2 s, the drain's first read came after the stream had ended).
STEP_MS = 40.0
TOKENS = 150


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``fairq sim`` process with slow steps; yields its base URL."""
    profile = tmp_path_factory.mktemp("sim") / "profile.yaml"
    profile.write_text(yaml.safe_dump({"step_base_ms": STEP_MS, "step_per_seq_ms": 0.0}))
    port = free_port()
    groups = ProcessGroups()
    args = ["sim", "--port", str(port), "--model", MODEL, "--profile", str(profile)]
    try:
        proc = groups.start([sys.executable, "-m", "fairq", *args])
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/health", proc, "the simulator")
        yield url
    finally:
        groups.kill_all()


class Stream(threading.Thread):
    """One streamed completion; ``started`` is set at its first chunk, ``ended_at`` is
    when its last byte came (monotonic)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.started = threading.Event()
        self.ended_at: float | None = None
        self.body = b""

    def run(self) -> None:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": TOKENS, "stream": True}
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=30) as r:
            for piece in r.iter_bytes():
                self.body += piece
                self.started.set()
        self.ended_at = time.monotonic()


def drain(*args: str, timeout_s: float = 30) -> tuple[subprocess.CompletedProcess[str], float]:
    """``fairq k8s drain ARGS``: the finished process and when it ended (monotonic)."""
    command = [sys.executable, "-m", "fairq", "k8s", "drain", "--interval-s", "0.05", *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout_s)
    return done, time.monotonic()


def test_the_drain_returns_only_after_the_running_stream_ended(engine: str) -> None:
    stream = Stream(engine)
    stream.start()
    assert stream.started.wait(10), "the stream did not start"
    done, returned_at = drain("--url", engine)
    stream.join(10)
    assert done.returncode == 0, done.stderr
    assert "holds no request" in done.stderr
    assert stream.ended_at is not None and b"[DONE]" in stream.body  # the answer was whole
    assert returned_at >= stream.ended_at
    assert returned_at - stream.ended_at < 2.0  # and soon after: it polls, it does not sleep


def test_the_drain_returns_at_once_on_an_idle_engine(engine: str) -> None:
    started = time.monotonic()
    done, returned_at = drain("--url", engine)
    assert done.returncode == 0, done.stderr
    assert "holds no request" in done.stderr
    assert returned_at - started < 5.0  # the process's own start-up; no waiting beyond it
    from fairq.k8s.drain import drain as in_process

    started = time.monotonic()
    assert in_process(engine, interval_s=1.0, say=lambda _: None) == 0
    assert time.monotonic() - started < 0.5, "one read of /metrics, no polling interval"


def test_a_drain_that_outlasts_its_bound_exits_1_and_says_what_is_left(engine: str) -> None:
    stream = Stream(engine)
    stream.start()
    assert stream.started.wait(10)
    done, _ = drain("--url", engine, "--timeout-s", "0.3")
    stream.join(10)
    assert done.returncode == 1
    assert "gave up after 0.3 s" in done.stderr and "requests running or waiting" in done.stderr


def test_the_installed_script_drains_with_the_standard_library_alone(
    engine: str, tmp_path: Path
) -> None:
    installed = subprocess.run(
        [sys.executable, "-m", "fairq", "k8s", "install-drain", str(tmp_path / "drain")],
        check=False, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    script = tmp_path / "drain" / "fairq_drain.py"
    stream = Stream(engine)
    stream.start()
    assert stream.started.wait(10)
    # -I: isolated, -S: no site-packages: as in an image that has Python but not fairq.
    command = [sys.executable, "-I", "-S", str(script), "--url", engine, "--interval-s", "0.05"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=30)
    returned_at = time.monotonic()
    stream.join(10)
    assert done.returncode == 0, done.stderr
    assert stream.ended_at is not None and returned_at >= stream.ended_at


def test_an_engine_that_is_gone_has_nothing_to_drain() -> None:
    done, _ = drain("--url", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 0
    assert "nothing listens" in done.stdout + done.stderr


def test_requests_in_sums_running_and_waiting_over_the_engines_series() -> None:
    load = (FIXTURES / "vllm-0.32-cpu" / "metrics_load.txt").read_text()
    assert requests_in(load) == 40.0  # 32 running + 8 waiting in the real capture
    idle = (FIXTURES / "vllm-0.32-cpu" / "metrics_idle.txt").read_text()
    assert requests_in(idle) == 0.0
    two = (
        'vllm:num_requests_running{engine="0",m="a b"} 2\nvllm:num_requests_running{engine="1"} 3\n'
    )
    assert requests_in(two + "vllm:num_requests_waiting_by_reason 7\n") == 5.0
    with pytest.raises(MetricsUnreadable):
        requests_in("# nothing here\nother_metric 1\n")
