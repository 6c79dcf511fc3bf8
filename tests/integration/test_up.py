"""``fairq up`` as a user runs it: one command, the official openai client, Ctrl-C.

The stack runs as real processes with its own private Redis; the test talks to
it only over HTTP on 127.0.0.1, then interrupts it and checks that no process
is left behind.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import psutil
import pytest

from fairq.localredis import free_port
from fairq.stack import Stack
from tests.support.eventually import eventually

pytestmark = pytest.mark.integration


def _wait_for_banner(process: subprocess.Popen[str], timeout_s: float) -> list[str]:
    """The lines ``fairq up`` prints up to its banner's last, read one by one."""
    lines: list[str] = []
    stdout = process.stdout
    assert stdout is not None

    def read() -> list[str]:
        line = stdout.readline()
        assert line, f"fairq up exited early: {''.join(lines)}"
        lines.append(line)
        return lines

    return eventually(
        read,
        "fairq up's banner",
        timeout_s,
        until=lambda seen: seen[-1].startswith("Ctrl-C stops everything"),
        interval_s=0,
    )


def test_fairq_up_serves_the_openai_client_and_ctrl_c_leaves_no_process() -> None:
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "fairq", "up", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "FAIRQ_LOG_LEVEL": "WARNING"},
    )
    try:
        banner = "".join(_wait_for_banner(up, timeout_s=60))
        assert f"http://127.0.0.1:{port}/v1" in banner and "fq-demo-alice" in banner
        assert "curl" in banner
        children = psutil.Process(up.pid).children(recursive=True)
        assert len(children) >= 6  # redis, 2 simulators, dispatcher, worker, gateway

        base_url = f"http://127.0.0.1:{port}/v1"
        with openai.OpenAI(base_url=base_url, api_key="fq-demo-alice") as client:
            stream = client.chat.completions.create(
                model="demo-chat",
                messages=[{"role": "user", "content": "Hello"}],
                stream=True,
                max_tokens=6,
            )
            pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
            assert len([p for p in pieces if p]) == 6
            completion = client.completions.create(
                model="demo-code", prompt="def f():", max_tokens=4
            )
            assert completion.choices[0].text and completion.usage is not None
            assert completion.usage.completion_tokens == 4
            models = {m.id for m in client.models.list()}
            assert models == {"demo-chat", "demo-code"}
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=30)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
    assert len(gone) == len(children)


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
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
