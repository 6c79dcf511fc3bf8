"""``fairq k8s probe``, the readiness probe of the pods that serve no HTTP, run as the
kubelet runs it: a real process against the session's real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairq.stack.localredis import free_port

pytestmark = pytest.mark.integration


def probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
    return subprocess.run(
        [sys.executable, "-m", "fairq", "k8s", "probe", "--timeout", "2"],
        env={**base, **env},
        check=False,  # the exit code is what we test
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_probe_passes_when_redis_answers(redis_url: str) -> None:
    result = probe({"FAIRQ_REDIS_URL": redis_url})
    assert result.returncode == 0, result.stderr


def test_probe_fails_when_nothing_listens_on_the_redis_port() -> None:
    result = probe({"FAIRQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert result.returncode == 1
    assert "Redis does not answer PING" in result.stderr


def test_probe_fails_with_exit_2_on_a_bad_configuration(redis_url: str, tmp_path: Path) -> None:
    config = tmp_path / "fairq.yaml"
    config.write_text("models: [{name: m}]\n")  # no endpoints
    result = probe({"FAIRQ_REDIS_URL": redis_url, "FAIRQ_CONFIG": str(config)})
    assert result.returncode == 2
    assert "configuration error" in result.stderr
