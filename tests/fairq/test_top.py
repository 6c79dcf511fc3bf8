"""``fairq top`` as an operator leaves it running: it outlives its Redis going away (and
shows the stack again once it is back), and on an 80-column terminal a local stack's
endpoints show whole."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from fairq.cli.views import render_status
from fairq.stack.localredis import LocalRedis
from tests.support.eventually import eventually
from tests.support.processes import ProcessGroups
from tests.support.settings import make_config

LOCAL = "http://127.0.0.1:55527"  # a simulator of `fairq up`
CLUSTER = "http://engine-llama-3-1-8b-0.engine-llama.fairq.svc.cluster.local:8000"


def _endpoint(url: str, **seen: Any) -> dict[str, Any]:
    room = {b: {"room": 3, "limit": 3} for b in ("interactive", "default", "batch")}
    return {"url": url, "healthy": True, "fresh": True, "waiting": 0, "running": 32,
            "batch_slots": 32, "kv_usage": 0.42, "tpot_ms": 12.3, "inflight": 40,
            "admission": room, **seen}  # fmt: skip


def _status(*urls: str, **seen: Any) -> dict[str, Any]:
    bands = [{"band": b, "queued": 3, "backlogged_users": 1,
              "top_users": [{"user": "alice", "queued": 3}]}
             for b in ("interactive", "default", "batch")]  # fmt: skip
    model = {"model": "demo-chat", "policy": "token_fair", "admission": "metrics",
             "source": "dispatcher", "dispatcher": "vm-1-abcdef", "dispatch_rate": 3.2,
             "endpoints": [_endpoint(u, **seen) for u in urls], "bands": bands,
             "in_engine_users": []}  # fmt: skip
    return {"at_ms": 0, "models": [model]}


def _shown(status: dict[str, Any], width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width).print(render_status(status, width))
    return out.getvalue()


def test_a_local_stacks_endpoint_and_every_column_show_whole_at_80_columns() -> None:
    shown = _shown(_status(LOCAL), 80)
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len([line for line in lines if LOCAL in line]) == 2, shown  # endpoints, admission
    for header in ("health", "waiting", "running", "batch", "KV", "TPOT", "flight"):
        assert header in shown, (header, shown)
    assert "…" not in shown, shown


def test_a_url_longer_than_the_terminal_has_room_for_is_folded_not_cut() -> None:
    # The widest cells too: the URL column gets what they leave, and folds.
    shown = _shown(_status(CLUSTER, healthy=False, kv_usage=1.0, tpot_ms=123.4), 80)
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = next(i for i, line in enumerate(lines) if line.startswith(" http://engine"))
    url = ""
    for line in lines[start:]:
        url += line.split()[0]
        if url == CLUSTER or len(url) >= len(CLUSTER):
            break
    assert url == CLUSTER, shown
    assert "unhealthy" in lines[start] and "100%" in lines[start] and "…" not in shown, shown


def test_top_outlives_its_redis_going_away_and_shows_the_stack_once_it_is_back(
    processes: ProcessGroups, tmp_path: Path
) -> None:
    config = tmp_path / "fairq.yaml"
    config.write_text(yaml.safe_dump(make_config()))
    with LocalRedis() as redis:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRQ_")}
        env |= {"FAIRQ_CONFIG": str(config), "FAIRQ_REDIS_URL": redis.url, "COLUMNS": "80",
                "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}  # fmt: skip
        top = processes.start(
            [sys.executable, "-m", "fairq", "top", "--interval", "0.2"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, text=True,
        )  # fmt: skip
        out: list[str] = []

        def read() -> None:
            assert top.stdout is not None
            with contextlib.suppress(ValueError):  # closed as the test ends
                for chunk in iter(lambda: top.stdout.read(1), ""):
                    out.append(chunk)

        threading.Thread(target=read, daemon=True).start()

        def printed(text: str) -> bool:
            assert top.poll() is None, "fairq top exited:\n" + "".join(out)
            return text in "".join(out)

        eventually(lambda: printed("fairq status at"), "the first frame", 20)
        redis.halt(kill=True)
        eventually(lambda: printed("Redis does not answer since"), "the line saying so", 20)
        redis.start()
        lost_at = "".join(out).rfind("Redis does not answer")

        def back() -> bool:
            # A frame without the red line: two frames' heads in a row after the last one.
            after = "".join(out)
            after = after[after.rfind("Redis does not answer") :]
            return after.count("fairq status at") >= 3 and printed("fairq status at")

        eventually(back, "a frame without the line, Redis back", 20)
        assert lost_at >= 0
        os.kill(top.pid, signal.SIGINT)
        assert top.wait(timeout=10) == 0, "".join(out)[-2000:]
