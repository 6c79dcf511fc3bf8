"""A fresh, private environment per arm, so no arm inherits another's state.

Each arm gets its engine (``benchmarks.lib.provision``: a fresh simulator or vLLM with
the policy the arm needs, or the user's engine), and for fairq arms its own
Redis, dispatcher, workers and gateway, all on 127.0.0.1. With CPU pinning the
engine runs on its core and fairq's processes and the load client on the other,
in every arm alike. With ``--engine-url`` the arms share the user's engine, and
the caller waits for it to be idle between arms.

Worker slots: every request the engine runs holds one worker slot, and the
H100-like profile batches 256 at once. Two workers with at least 300 slots each
leave the engine, not the workers, as the limit; otherwise worker concurrency
would hold requests back and arm (b) would not be "without backpressure".
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.fairness.arms import ArmSpec, model_config, policy
from benchmarks.fairness.scenarios import Scenario, plan
from benchmarks.lib.cpu import (
    ENGINE_CPUS,
    FAIRQ_CPUS,
    ProcessGroups,
    descendants,
    pin_pids,
    pinned,
)
from benchmarks.lib.load import Target
from benchmarks.lib.provision import WORKERS, EngineChoice, engine_for, worker_slots
from broker import hash_key
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack

IDLE_USER = "idle"  # measures TTFT on the idle engine; never part of the flood
START_TIMEOUT_S = 60.0
_QUIET = {"FAIRQ_LOG_LEVEL": "WARNING"}


@dataclass(frozen=True)
class Setup:
    """What every arm of one scenario shares."""

    scenario: Scenario
    engine: EngineChoice

    @property
    def model(self) -> str:
        return self.engine.model


@dataclass
class ArmEnv:
    target: Target
    engine_url: str
    groups: ProcessGroups
    stacks: tuple[Stack, ...] = ()
    engine_dead: Callable[[], str | None] | None = None  # the engine's own liveness check
    heavy_window: int | None = None  # heavy requests open at once at most (None: no bound)

    def dead(self) -> str | None:
        """A process of the arm that exited mid-arm, if any."""
        if self.engine_dead is not None and (name := self.engine_dead()) is not None:
            return name
        return next((n for s in self.stacks if (n := s.dead()) is not None), None)


def user_keys(scenario: Scenario) -> dict[str, str]:
    users = [*scenario.heavy_users(), IDLE_USER, *scenario.light_user_names()]
    return {user: f"fq-bench-{user.lower()}" for user in users}


def max_requests(scenario: Scenario) -> int:
    """The most requests an arm can have open at once: the whole plan, and idle."""
    return len(plan(scenario)) + 1


def fairq_config(spec: ArmSpec, setup: Setup, engine_url: str) -> dict[str, Any]:
    """fairq's configuration for the arm: the model, and a key per user, each heavy
    user its own tenant with its weight (token_fair shares by tenant weight)."""
    scenario = setup.scenario
    weights = scenario.heavy_users()
    keys = [
        {"sha256": hash_key(key), "user": user, "tenant": user, "weight": weights.get(user, 1.0)}
        for user, key in user_keys(scenario).items()
    ]
    heavy = scenario.power_requests * len(weights)
    return {
        "models": [
            model_config(
                spec, setup.model, engine_url, max_requests(scenario), setup.engine.batch_slots
            )
        ],
        "api_keys": keys,
        "max_queued_per_user": max(1000, heavy + 10),
    }


@contextlib.contextmanager
def arm_env(spec: ArmSpec, setup: Setup) -> Iterator[ArmEnv]:
    """Start what the arm needs; stop all of it on the way out (Ctrl-C included)."""
    window = _heavy_window(spec, setup)
    with (
        tempfile.TemporaryDirectory(prefix="fairq-bench-") as folder,
        contextlib.ExitStack() as on_exit,
    ):
        engine = on_exit.enter_context(engine_for(setup.engine, policy(spec), Path(folder)))
        engine_pids = frozenset(descendants())
        if setup.engine.pinning:
            if setup.engine.kind == "sim":  # vLLM pins itself
                pin_pids(engine_pids, ENGINE_CPUS)
            on_exit.enter_context(pinned(FAIRQ_CPUS))
        stacks: tuple[Stack, ...] = ()
        if spec.via_fairq:
            stack = _fairq_stack(spec, setup, engine.url)
            on_exit.enter_context(_running(stack))
            stacks = (stack,)
        groups = ProcessGroups(engine_pids, frozenset(descendants()) - engine_pids, _labels(stacks))
        target = _target(spec, setup, engine.url, stacks)
        yield ArmEnv(target, engine.url, groups, stacks, engine.dead, heavy_window=window)


def _heavy_window(spec: ArmSpec, setup: Setup) -> int | None:
    """The heavy requests the arm keeps open at once: the engine's batch + 1 (None: no
    bound). Raises ValueError before anything starts when the arm needs an unknown batch."""
    if not spec.heavy_window:
        return None
    slots = setup.engine.batch_slots
    if slots is None:
        raise ValueError(f"arm ({spec.key}) needs the engine's batch, unknown for this engine")
    return slots + 1


def _fairq_stack(spec: ArmSpec, setup: Setup, engine_url: str) -> Stack:
    slots = str(worker_slots(max_requests(setup.scenario)))
    return Stack(fairq_config(spec, setup, engine_url), gateway_port=free_port(),
                 workers=WORKERS, batch_workers=0,
                 env={**_QUIET, "FAIRQ_WORKER_CONCURRENCY": slots})  # fmt: skip


def _labels(stacks: tuple[Stack, ...]) -> dict[int, str]:
    labels = {p.pid: name for s in stacks for name, p in s.processes.items()}
    return labels | {pid: "redis and others" for pid in descendants() if pid not in labels}


@contextlib.contextmanager
def _running(stack: Stack) -> Iterator[None]:
    stack.start(START_TIMEOUT_S)  # stops what it started if it fails
    try:
        yield
    finally:
        stack.stop()


def _target(spec: ArmSpec, setup: Setup, engine_url: str, stacks: tuple[Stack, ...]) -> Target:
    if stacks:
        url = f"{stacks[0].gateway_url}/v1/chat/completions"
        return Target(url, setup.model, keys=user_keys(setup.scenario))
    url = f"{engine_url}/v1/chat/completions"
    return Target(url, setup.model, priorities=spec.client_priorities, token_ids=spec.token_ids)
