"""``fairq demo newcomer`` against the real local stack of ``fairq up`` (its demo config).

A smaller flood than the README's (40 answers of 600 tokens still fill the simulated
engine's 32 slots and queue the rest in fairq): bob's first token comes within a
second, every look at his queued job and at alice's last one has an estimated wait,
and the demo leaves none of alice's jobs running or queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fairq.cli.demo import Flood, newcomer
from fairq.stack.processes import DEMO_BATCH_SLOTS, DEMO_MODELS, Stack
from tests.support.cli import fairq
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

ALICE, BOB = "fq-demo-alice", "fq-demo-bob"
_ENDED = {"completed", "failed", "cancelled", "expired"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with demo_stack() as running:  # as `fairq up` runs it: the batch learned, not told
        yield running


def test_bob_gets_his_first_token_within_a_second_of_alices_long_flood(stack: Stack) -> None:
    lines: list[str] = []
    flood = Flood(model=DEMO_MODELS[0], requests=40, max_tokens=600)
    run = asyncio.run(newcomer(stack.gateway_url, ALICE, BOB, flood, say=lines.append))
    report = "\n".join(lines)
    assert run.bob_ttft_s is not None and run.bob_ttft_s < 1.0, report
    # alice filled the engine's batch and waited in fairq beyond it
    assert run.alice_streaming <= DEMO_BATCH_SLOTS, report
    assert run.alice_last is not None and run.alice_last.status == "queued", report
    assert run.alice_last.estimated_wait_s is not None, report
    assert all(wait is not None for wait in run.bob_waits), report
    assert f"bob: first token after {run.bob_ttft_s:.3f} s" in report
    assert len(run.alice_jobs) == flood.requests and run.alice_cancelled >= 1, report
    headers = {"Authorization": f"Bearer {ALICE}"}
    with httpx.Client(base_url=stack.gateway_url, headers=headers, timeout=10) as client:
        states = [client.get(f"/v1/jobs/{job}").json()["status"] for job in run.alice_jobs]
    assert set(states) <= _ENDED, states


def test_fairq_demo_newcomer_runs_right_after_make_run_without_openai(
    stack: Stack, tmp_path: Path
) -> None:
    # `make run` installs what running needs, not the openai client: a package of that
    # name that cannot be imported stands in for its absence.
    (tmp_path / "openai").mkdir()
    (tmp_path / "openai" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'openai'\", name='openai')\n"
    )
    done = fairq(
        "demo", "newcomer", "--url", stack.gateway_url, "--requests", "40", "--max-tokens", "600",
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "bob: first token after" in done.stdout, done.stdout
    assert "of her 40 jobs cancelled" in done.stdout, done.stdout
