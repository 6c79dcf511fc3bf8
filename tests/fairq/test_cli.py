"""The ``fairq`` command as a user meets it, each run as a real process: its version, its
help, and a failure as one line to act on (the traceback only with ``--debug``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fairq.localredis import free_port
from tests.support.settings import make_config

RUN_S = 60


def fairq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRQ_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "fairq", *args],
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "fairq.yaml"
    path.write_text(yaml.safe_dump(make_config(model="m")))
    return path


def test_version_names_the_installed_release() -> None:
    done = fairq("--version")
    assert done.returncode == 0
    assert done.stdout.strip().startswith("fairq 0.")


def test_help_names_the_environment_every_command_reads() -> None:
    done = fairq("--help")
    assert done.returncode == 0
    for name in ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL", "FAIRQ_API_URL", "FAIRQ_LOG_LEVEL"):
        assert name in done.stdout


def test_redis_down_is_one_line_and_exit_1(config: Path) -> None:
    env = {"FAIRQ_CONFIG": str(config), "FAIRQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}"}
    done = fairq("status", env=env)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert "cannot reach Redis" in lines[0] and "FAIRQ_REDIS_URL" in lines[0]
    assert "--debug" in lines[1]


def test_debug_shows_the_traceback(config: Path) -> None:
    env = {"FAIRQ_CONFIG": str(config), "FAIRQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}"}
    done = fairq("--debug", "status", env=env)
    assert done.returncode == 1
    assert "Traceback" in done.stderr


def test_batch_submit_takes_the_key_after_the_subcommand(tmp_path: Path) -> None:
    lines = tmp_path / "requests.jsonl"
    lines.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    gateway = f"http://127.0.0.1:{free_port()}"  # nothing listens: the key got through
    done = fairq(
        "batch", "submit", str(lines), "--model", "m", "--api-key", "k", "--api-url", gateway
    )
    assert "No such option" not in done.stderr
    assert done.returncode == 1
    assert f"cannot reach {gateway}/v1/files" in done.stderr
    assert "Traceback" not in done.stderr


def test_batch_without_any_key_says_how_to_give_one(tmp_path: Path) -> None:
    lines = tmp_path / "requests.jsonl"
    lines.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    done = fairq("batch", "submit", str(lines))
    assert done.returncode == 2
    assert "FAIRQ_API_KEY" in done.stderr and "--api-key" in done.stderr


def test_the_batch_worker_console_shows_fairq_lines_not_rqs_maintenance(
    config: Path, redis_url: str
) -> None:
    env = os.environ | {"FAIRQ_CONFIG": str(config), "FAIRQ_REDIS_URL": redis_url}
    env |= {"FAIRQ_METRICS_PORT": "0", "FAIRQ_LOG_LEVEL": "INFO"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "fairq", "batch-worker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        time.sleep(4)  # several maintenance rounds (batch.sweep_interval_s is 1 s)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        output, _ = worker.communicate(timeout=RUN_S)
    assert "batch worker" in output and "fairq-batch" in output  # fairq's own start line
    assert "cleaning registries" not in output
    assert "Acquired scheduler lock" not in output
