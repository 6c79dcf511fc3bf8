"""``fairq bench fairness --engine-url``: the engine's scheduling policy comes from
``--engine-policy`` or from the engine itself (vLLM's ``/server_info``), never from an
error. The engine here is the simulator as vLLM 0.32 behaves: FIFO, taking a request's
``priority`` and ignoring it, saying its policy only in dev mode."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from benchmarks.lib.provision import SIM_MODEL
from fairq.cli import main
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack
from sim import load_profile
from tests.support import local_http

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Light answers of 10 tokens: every arm first times light requests one at a time.
SMALL = [
    "--scenario", "seed", "--power-requests", "20", "--prompt-tokens", "20",
    "--output-tokens", "10", "--light-users", "1", "--light-start-s", "0.1",
    "--light-output-tokens", "10",
]  # fmt: skip


@pytest.fixture
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A simulator at its own URL; ``request.param``: its profile's changes."""
    changes: dict[str, Any] = getattr(request, "param", {})
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        yaml.safe_dump(load_profile("default").model_copy(update=changes).model_dump())
    )
    port = free_port()
    stack = Stack({}, gateway_port=0, sims={port: SIM_MODEL}, sim_profiles={port: str(profile)},
                  workers=0, dispatchers=0, gateway=False)  # fmt: skip
    with stack:
        yield f"http://127.0.0.1:{port}"


def bench(engine: str, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "out"
    argv = ["bench", "fairness", *SMALL, "--engine-url", engine, "--out", str(out), *args]
    result = CliRunner().invoke(main, argv)
    if result.exit_code != 0:
        return result.exit_code, {}, result.output
    return 0, json.loads((out / "fairness.json").read_text()), result.output


def test_a_fifo_engine_that_ignores_priority_is_labelled_unknown_and_gets_no_priority_arm(
    engine: str, tmp_path: Path
) -> None:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert local_http.post(f"{engine}/v1/chat/completions", json={**body, "priority": 1}).is_success

    code, figures, output = bench(engine, tmp_path, "--arms", "a,e,f")
    assert code == 0, output
    arms = figures["scenarios"]["seed"]["arms"]
    assert arms["a"]["status"] == "ok"
    assert arms["a"]["title"] == "engine FIFO (direct) [engine policy unknown, no priorities sent]"
    for key in ("e", "f"):
        assert arms[key]["status"] == "not available"
        assert "is unknown" in arms[key]["reason"]
        assert "say --engine-policy priority" in arms[key]["reason"]
    assert "Its scheduling policy is unknown" in figures["engine_note"]


def test_a_stated_policy_names_the_arm_and_keeps_out_the_other_policys_arms(
    engine: str, tmp_path: Path
) -> None:
    code, figures, output = bench(engine, tmp_path, "--arms", "a,e", "--engine-policy", "fcfs")
    assert code == 0, output
    arms = figures["scenarios"]["seed"]["arms"]
    assert arms["a"]["title"] == "engine FIFO (direct) [engine fcfs, per --engine-policy]"
    assert arms["e"]["reason"] == f"the engine at {engine} runs fcfs (per --engine-policy)"


@pytest.mark.parametrize(
    "engine", [{"scheduling_policy": "priority", "dev_mode": True}], indirect=True
)
def test_an_engine_that_says_its_policy_on_server_info_is_taken_at_its_word(
    engine: str, tmp_path: Path
) -> None:
    code, figures, output = bench(engine, tmp_path, "--arms", "a,e")
    assert code == 0, output
    arms = figures["scenarios"]["seed"]["arms"]
    assert arms["e"]["status"] == "ok"
    assert arms["e"]["title"] == "engine priority (direct) [engine priority, per its /server_info]"
    assert arms["a"]["reason"] == f"the engine at {engine} runs priority (per its /server_info)"

    code, _, output = bench(engine, tmp_path, "--arms", "e", "--engine-policy", "fcfs")
    assert code == 2
    assert "--engine-policy fcfs, but the engine" in output and "runs priority" in output
