"""The ``fairq`` command as a user meets it, each run as a real process: its version, its
help, and a failure as one line to act on (the traceback only with ``--debug``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from fairq.cli import main
from fairq.stack.localredis import free_port
from tests.support.cli import RUN_S, fairq
from tests.support.processes import ProcessGroups
from tests.support.settings import make_config


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
    config: Path, redis_url: str, processes: ProcessGroups
) -> None:
    env = os.environ | {"FAIRQ_CONFIG": str(config), "FAIRQ_REDIS_URL": redis_url}
    env |= {"FAIRQ_METRICS_PORT": "0", "FAIRQ_LOG_LEVEL": "INFO"}
    worker = processes.start(
        [sys.executable, "-m", "fairq", "batch-worker"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(4)  # several maintenance rounds (batch.sweep_interval_s is 1 s)
    os.killpg(worker.pid, signal.SIGTERM)
    output, _ = worker.communicate(timeout=RUN_S)
    assert "batch worker" in output and "fairq-batch" in output  # fairq's own start line
    assert "cleaning registries" not in output
    assert "Acquired scheduler lock" not in output


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        found.append((*path, name))
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
    return found


# What each command reads, beyond "none": the help must name it.
READS = {
    ("api",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL", "FAIRQ_LOG_LEVEL", "[INFO]"),
    ("dispatcher",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL", "FAIRQ_METRICS_PORT", "[9464;",
                      "FAIRQ_METRICS_HOST", "[127.0.0.1]"),
    ("worker",): ("FAIRQ_REDIS_URL", "FAIRQ_WORKER_CONCURRENCY", "[64]", "[9465;"),
    ("batch-worker",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL", "FAIRQ_METRICS_PORT", "[9466;"),
    ("keda-scaler",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL", "FAIRQ_METRICS_PORT", "[9468;"),
    ("status",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL"),
    ("top",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL"),
    ("jobs",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL"),
    ("job",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL"),
    ("up",): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL", "FAIRQ_LOG_LEVEL", "private Redis"),
    ("k8s", "probe"): ("FAIRQ_CONFIG", "FAIRQ_REDIS_URL"),
    ("config",): ("FAIRQ_<SETTING>",),
    ("config", "check"): ("FAIRQ_<SETTING>",),
    ("bench", "fairness"): ("FAIRQ_VLLM_HOME",),
    ("bench", "tenants"): ("FAIRQ_VLLM_HOME",),
    ("sim",): ("FAIRQ_LOG_LEVEL", "[INFO]", "FAIRQ_SIM_STARTUP_S", "--startup-s [0]"),
}  # fmt: skip
BATCH = ("FAIRQ_API_URL", "[http://127.0.0.1:8000]", "FAIRQ_API_KEY", "OPENAI_API_KEY")
READS |= {("batch", *sub): BATCH for sub in ((), ("submit",), ("status",), ("results",),
                                             ("cancel",))}  # fmt: skip


def test_every_commands_help_names_the_environment_it_reads_and_its_defaults() -> None:
    runner = CliRunner()
    commands = _commands(main)
    assert set(READS) <= set(commands)
    for path in commands:
        done = runner.invoke(main, [*path, "--help"], env={"COLUMNS": "200"})
        assert done.exit_code == 0, (path, done.output)
        assert "Environment:" in done.output, path
        for name in READS.get(path, ()):
            assert name in done.output, (path, name)
        if path not in READS:
            assert "Environment: none read" in done.output, path


@pytest.mark.parametrize("command", ["status", "top", "jobs"])
def test_the_stack_views_say_what_is_missing_instead_of_an_empty_stack(command: str) -> None:
    redis = f"redis://127.0.0.1:{free_port()}/0"
    done = fairq(command, env={"FAIRQ_REDIS_URL": redis})
    assert done.returncode == 2
    assert f"fairq {command} needs FAIRQ_CONFIG" in done.stderr
    assert "`fairq up` prints the export lines" in done.stderr
    assert "0 of 0 jobs" not in done.stdout and "Traceback" not in done.stderr


def test_the_stack_views_name_a_missing_redis_url(config: Path) -> None:
    done = fairq("jobs", env={"FAIRQ_CONFIG": str(config)})
    assert done.returncode == 2
    assert "fairq jobs needs FAIRQ_REDIS_URL" in done.stderr
