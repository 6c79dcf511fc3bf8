"""``fairq up`` as a user runs it: one command, the official openai client, Ctrl-C.

The stack runs as real processes with its own private Redis; the test talks to it only
over HTTP on 127.0.0.1 and through the commands the banner tells a user to run, then
interrupts it and checks that no process is left behind. Every ``fairq up`` runs in a
process group of its own that the ``processes`` fixture kills whole when the test ends,
passed or failed (tests/support/processes.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import psutil
import pytest
import yaml

from fairq.cli.console import QUIET_S, rows
from fairq.stack.localredis import LocalRedis, free_port
from fairq.stack.processes import Stack
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.processes import ProcessGroups
from tests.support.settings import ALICE_KEY, MODEL, make_config
from tests.support.stack import sim

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
START_S = 60.0
# A user's environment: nothing of fairq's set, the log at its default level.
USER_ENV = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}


class Up:
    """A running ``fairq up``: its output, line by line as a terminal would show it."""

    def __init__(self, processes: ProcessGroups, *args: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.process = processes.start(
            [sys.executable, "-m", "fairq", "up", "--port", str(self.port), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=USER_ENV | env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(ValueError):  # closed by the fixture as the test ends
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))

    def banner(self, timeout_s: float = START_S) -> list[str]:
        """The banner's lines (the first time it is printed), once they all are."""

        def printed() -> list[str]:
            assert self.process.poll() is None, "fairq up exited:\n" + "\n".join(self.lines)
            lines = list(self.lines)
            start = next((i for i, x in enumerate(lines) if x.startswith("fairq is up")), None)
            if start is None:
                return []
            end = next((i for i in range(start, len(lines)) if "FAIRQ_REDIS_URL" in lines[i]), 0)
            return lines[start : end + 1] if end else []

        return eventually(printed, "the banner", timeout_s, interval_s=0.1)

    def exports(self) -> dict[str, str]:
        """The environment the banner's export lines give another shell."""
        found = {}
        for line in self.banner():
            if line.strip().startswith("export FAIRQ_"):
                name, _, value = line.strip().removeprefix("export ").partition("=")
                found[name] = value
        return found

    def fairq(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A ``fairq`` command run in another shell after the banner's export lines."""
        return subprocess.run(
            [sys.executable, "-m", "fairq", *args],
            env=USER_ENV | self.exports(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def interrupt(self) -> int:
        """Ctrl-C, as the terminal sends it to the foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)
        return self.process.wait(timeout=30)

    def ended(self, timeout_s: float = 30.0) -> int:
        """Its exit status once it exits by itself, every line it printed read."""
        code = self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return code

    def said(self, text: str) -> list[str]:
        """Its own lines (``fairq up: ...``) that contain ``text``."""
        return [x for x in self.lines if x.startswith("fairq up:") and text in x]

    def child(self, text: str) -> psutil.Process:
        """Its child process whose command line (as ``ps`` shows it) holds ``text``."""
        for process in psutil.Process(self.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if text in " ".join(process.cmdline()):
                    return process
        raise AssertionError(f"no child of fairq up runs {text!r}")

    def redis(self) -> psutil.Process:
        """Its private Redis (the server names itself after its address in ``ps``)."""
        port = urlsplit(self.exports()["FAIRQ_REDIS_URL"]).port
        return self.child(f"127.0.0.1:{port}")


def test_fairq_up_serves_the_openai_client_and_ctrl_c_leaves_no_process(
    processes: ProcessGroups,
) -> None:
    up = Up(processes, env={})
    banner = "\n".join(up.banner())
    assert f"http://127.0.0.1:{up.port}/v1" in banner and "fq-demo-alice" in banner
    assert "curl" in banner
    children = psutil.Process(up.process.pid).children(recursive=True)
    assert len(children) >= 6  # redis, 2 simulators, dispatcher, worker, gateway

    base_url = f"http://127.0.0.1:{up.port}/v1"
    with openai.OpenAI(base_url=base_url, api_key="fq-demo-alice") as client:
        stream = client.chat.completions.create(
            model="demo-chat",
            messages=[{"role": "user", "content": "Hello"}],
            stream=True,
            max_tokens=6,
        )
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        assert len([p for p in pieces if p]) == 6
        completion = client.completions.create(model="demo-code", prompt="def f():", max_tokens=4)
        assert completion.choices[0].text and completion.usage is not None
        assert completion.usage.completion_tokens == 4
        assert {m.id for m in client.models.list()} == {"demo-chat", "demo-code"}

    assert up.interrupt() == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert "fairq up: stopped" in up.lines


def test_each_component_gets_one_line_per_state_change_before_the_banner(
    processes: ProcessGroups,
) -> None:
    up = Up(processes, env={})
    up.banner()
    start = up.lines[: up.lines.index(next(x for x in up.lines if "fairq is up" in x))]
    for name in ("sim-demo-chat", "sim-demo-code", "api"):
        assert len([x for x in start if f" {name} " in x and "ready at" in x]) == 1, start
    for name in ("dispatcher-0", "worker-0", "batch-worker-0", "api"):
        assert len([x for x in start if f" {name} " in x and "started (pid" in x]) == 1, start
    assert len([x for x in start if " redis " in x and "ready at redis://" in x]) == 1


def test_the_banner_is_still_on_the_first_screen_after_the_stack_idled(
    processes: ProcessGroups,
) -> None:
    # `make run` in an 80x24 terminal: what the screen shows is the last 24 rows printed.
    # Every periodic task of an idle stack runs at least every 3 s with the default
    # settings but the workers' look for gone workers' names (once a minute): brought to
    # the same pace, each runs several times in the wait below.
    up = Up(processes, env={"FAIRQ_FORGET_EVERY_MS": "3000"})
    banner = up.banner()
    assert rows(banner, 80) <= 22, "the banner does not fit one screen"
    # The console prints the banner again once the log was quiet for QUIET_S, so only
    # lines that come closer together than that keep it off the screen: long enough for
    # as many of them as push it off.
    lines_that_push_it_off = 24 - rows(banner, 80) + 1
    time.sleep(lines_that_push_it_off * QUIET_S)
    screen = _last_rows(up.lines, columns=80, height=24)
    assert any(line.startswith("fairq is up") for line in screen), "\n".join(screen)
    for line in banner:
        assert line in screen
    assert up.process.poll() is None


def _last_rows(lines: list[str], *, columns: int, height: int) -> list[str]:
    shown: list[str] = []
    for line in reversed(lines):
        if rows([*shown, line], columns) > height:
            break
        shown.insert(0, line)
    return shown


def test_fairq_up_runs_the_configuration_fairq_config_names(
    processes: ProcessGroups, tmp_path: Path
) -> None:
    with sim() as engine:
        config = tmp_path / "mine.yaml"
        config.write_text(yaml.safe_dump(make_config([engine])))
        up = Up(processes, env={"FAIRQ_CONFIG": str(config)})
        banner = "\n".join(up.banner())
        assert f"config: {config}" in banner
        assert f"{MODEL}  vllm" in banner and engine in banner
        assert "fq-demo" not in banner  # the user's keys, not the demo's
        assert up.exports()["FAIRQ_CONFIG"] == str(config)

        url = f"http://127.0.0.1:{up.port}/v1"
        with openai.OpenAI(base_url=url, api_key=ALICE_KEY) as client:
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert answer.usage is not None and answer.usage.completion_tokens == 3
        status = up.fairq("status", "--json")
        assert status.returncode == 0, status.stderr
        assert [m["model"] for m in json.loads(status.stdout)["models"]] == [MODEL]
        assert up.interrupt() == 0


def test_engine_url_puts_the_demo_keys_in_front_of_the_engine_and_scrapes_it(
    processes: ProcessGroups,
) -> None:
    with sim() as engine:
        up = Up(processes, "--engine-url", f"{engine}/v1", env={})  # no --model: asked
        banner = "\n".join(up.banner())
        assert f"{MODEL}  vllm engine at {engine}" in banner
        with openai.OpenAI(base_url=f"http://127.0.0.1:{up.port}/v1", api_key="fq-demo-bob") as c:
            stream = c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                stream=True,
            )  # fmt: skip
            assert len([x for x in stream if x.choices and x.choices[0].delta.content]) == 4

        def scraped() -> dict[str, object]:
            status = up.fairq("status", "--json")
            assert status.returncode == 0, status.stderr
            (endpoint,) = json.loads(status.stdout)["models"][0]["endpoints"]
            return dict(endpoint)

        endpoint = eventually(scraped, "the engine's metrics in the status", 20,
                              until=lambda ep: ep.get("fresh") and ep.get("healthy"))  # fmt: skip
        assert endpoint["url"] == engine
        assert up.interrupt() == 0


def test_a_second_fairq_up_in_a_shell_holding_the_first_ones_exports_refuses_in_one_line(
    processes: ProcessGroups,
) -> None:
    # The shell still holds the first stack's export lines: FAIRQ_REDIS_URL names its
    # private Redis, FAIRQ_CONFIG its configuration. Joined, the second stack's engines
    # would serve the first's queues.
    first = Up(processes, env={})
    second = Up(processes, env=first.exports())
    assert second.ended() == 2, "\n".join(second.lines)
    (refusal,) = second.said("private Redis")
    assert f"the fairq up at pid {first.process.pid}" in refusal
    assert "`unset FAIRQ_REDIS_URL FAIRQ_CONFIG`" in refusal
    assert not [x for x in second.lines if "started (pid" in x or "ready at" in x]
    assert first.process.poll() is None
    assert first.interrupt() == 0


def test_fairq_up_shares_a_redis_the_user_runs(processes: ProcessGroups) -> None:
    with LocalRedis() as mine:  # the user's own: no stack claims it
        up = Up(processes, "--redis-url", mine.url, env={})
        assert up.exports()["FAIRQ_REDIS_URL"] == mine.url
        assert not [x for x in up.lines if " redis " in x and "ready at" in x]
        assert up.interrupt() == 0


def test_fairq_up_starts_its_dead_redis_again_and_stops_naming_it_when_it_dies_again(
    processes: ProcessGroups,
) -> None:
    up = Up(processes, env={})
    up.banner()
    first = up.redis()
    first.kill()
    eventually(lambda: [x for x in up.lines if " redis " in x and "ready at" in x and "again" in x],
               "the line that says the Redis is back", 20)  # fmt: skip
    assert [x for x in up.lines if " redis " in x and "was killed (SIGKILL): starting" in x]
    body = {"model": "demo-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"http://127.0.0.1:{up.port}/v1/chat/completions"
    auth = {"Authorization": "Bearer fq-demo-alice"}
    eventually(lambda: local_http.post(url, json=body, headers=auth, timeout=10).status_code,
               "a completion after the restart", 30, until=lambda code: code == 200,
               ignoring=(httpx.HTTPError,))  # fmt: skip
    again = up.redis()
    assert again.pid != first.pid
    again.kill()
    assert up.ended() == 1, "\n".join(up.lines[-20:])
    (line,) = up.said("stopping the stack")
    assert line == "fairq up: redis was killed (SIGKILL) again within 60 s; stopping the stack"


def test_a_component_that_exits_stops_the_stack_with_exit_1_and_a_line_naming_it(
    processes: ProcessGroups,
) -> None:
    up = Up(processes, env={})
    up.banner()
    children = psutil.Process(up.process.pid).children(recursive=True)
    up.child("-m fairq worker").kill()
    assert up.ended() == 1, "\n".join(up.lines[-20:])
    assert up.said("stopping the stack") == [
        "fairq up: worker-0 was killed (SIGKILL); stopping the stack"
    ]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


def test_fairq_up_started_with_sigint_ignored_still_stops_on_ctrl_c(
    processes: ProcessGroups,
) -> None:
    # A shell's background job (and a test session started from one) ignores SIGINT,
    # and an ignored signal stays ignored across exec: fairq up takes it back.
    up_args = ["--port", str(free_port())]
    shell = 'trap \'\' INT; exec "$0" -m fairq up "$@"'
    process = processes.start(
        ["sh", "-c", shell, sys.executable, *up_args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=USER_ENV,
    )  # fmt: skip
    assert process.stdout is not None
    eventually(lambda: "fairq is up" in process.stdout.readline(), "the banner", START_S,
               interval_s=0)  # fmt: skip
    children = psutil.Process(process.pid).children(recursive=True)
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=30) == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


def test_a_failing_test_leaves_no_process_of_fairq_up(tmp_path: Path) -> None:
    # A test session of its own whose one test starts fairq up and fails: the finalizer
    # kills fairq up's whole process group.
    pids = tmp_path / "pids.json"
    (tmp_path / "test_failing.py").write_text(
        textwrap.dedent(f"""
        import json, subprocess, sys

        import psutil

        from fairq.stack.localredis import free_port
        from tests.support.processes import processes  # noqa: F401

        def test_fails(processes):
            port = str(free_port())
            up = processes.start([sys.executable, "-m", "fairq", "up", "--port", port],
                                 stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
            for line in up.stdout:
                if line.startswith("fairq is up"):
                    break
            tree = [up.pid] + [p.pid for p in psutil.Process(up.pid).children(recursive=True)]
            open({str(pids)!r}, "w").write(json.dumps(tree))
            assert False, "this test fails on purpose"
        """)
    )
    pytest_args = ["-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull]
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_args, str(tmp_path / "test_failing.py")],
        cwd=tmp_path, env=os.environ | {"PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert inner.returncode == 1 and "this test fails on purpose" in inner.stdout, inner.stdout
    tree = json.loads(pids.read_text())
    assert len(tree) >= 7  # fairq up, redis, 2 simulators, dispatcher, worker, batch worker, api
    alive = eventually(lambda: [p for p in tree if _running(p)], "the tree gone", 10,
                       until=lambda left: not left)  # fmt: skip
    assert not alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_child_restarted_from_a_short_lived_thread_outlives_the_thread() -> None:
    # Children die with their parent through PR_SET_PDEATHSIG, which the kernel sends when
    # the *thread* that started them ends: the stack starts every child on its own thread.
    port = free_port()
    with Stack({"models": []}, gateway_port=free_port(), sims={port: "m"}, gateway=False,
               workers=0, dispatchers=0, batch_workers=0) as stack:  # fmt: skip
        restart = threading.Thread(target=stack.kill_and_restart, args=("sim-m",))
        restart.start()
        restart.join()
        stack._wait_http(f"http://127.0.0.1:{port}/health", 30)
        time.sleep(2.0)  # a SIGTERM from the thread's end stops the simulator within this
        assert stack.dead() is None
        assert local_http.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
