"""A fresh, private environment per arm, so no arm inherits another's state.

Each arm gets its own simulator process (from a temporary profile derived from
the chosen one, FCFS or priority as the arm needs), and for fairq arms its own
Redis, dispatcher, workers and gateway, all on 127.0.0.1. With ``--engine-url``
no simulator starts: the arms share the user's engine, and the caller waits
for it to be idle between arms.

Worker slots: every request the engine runs holds one worker slot, and the
H100-like profile batches 256 at once. Two workers with at least 300 slots each
leave the engine, not the workers, as the limit; otherwise worker concurrency
would hold requests back and arm (b) would not be "without backpressure".
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks._fairness_arms import ARMS, ArmSpec, model_config
from benchmarks._fairness_load import POWER_USER, Scenario, Target, light_user_name
from broker import hash_key
from fairq.localredis import free_port
from fairq.stack import Stack

SIM_MODEL = "sim-model"
IDLE_USER = "idle"  # measures TTFT on the idle engine; never part of the flood
WORKERS = 2
MIN_WORKER_SLOTS = 300
START_TIMEOUT_S = 60.0
_QUIET = {"FAIRQ_LOG_LEVEL": "WARNING"}
_NO_PRIORITY_SCHEDULING = "Priority scheduling is not enabled"  # vLLM's own words


@dataclass(frozen=True)
class Setup:
    """What every arm of one run shares."""

    scenario: Scenario
    profile: str  # simulator profile name or path (ignored with engine_url)
    engine_url: str | None  # the user's engine; None: a simulator per arm
    model: str  # the served model name


@dataclass
class ArmEnv:
    target: Target
    engine_url: str
    stack: Stack | None

    def dead(self) -> str | None:
        """A stack process that exited mid-arm, if any."""
        return None if self.stack is None else self.stack.dead()


def user_keys(scenario: Scenario) -> dict[str, str]:
    users = [POWER_USER, IDLE_USER, *(light_user_name(i) for i in range(scenario.light_users))]
    return {user: f"fq-bench-{user.lower()}" for user in users}


def max_requests(scenario: Scenario) -> int:
    """The most requests an arm can have open at once: the flood, the light users, idle."""
    return scenario.power_requests + scenario.light_users + 1


def worker_slots(scenario: Scenario) -> int:
    return max(MIN_WORKER_SLOTS, -(-max_requests(scenario) // WORKERS) + 8)


def fairq_config(spec: ArmSpec, setup: Setup, engine_url: str) -> dict[str, Any]:
    keys = user_keys(setup.scenario)
    return {
        "models": [model_config(spec, setup.model, engine_url, max_requests(setup.scenario))],
        "api_keys": [{"sha256": hash_key(key), "user": user} for user, key in keys.items()],
        "max_queued_per_user": max(1000, setup.scenario.power_requests + 10),
    }


def write_profile(base: str, priority: bool, folder: Path) -> Path:
    """The chosen profile with the arm's scheduling policy, as a YAML file."""
    from workers.sim import load_profile

    profile = load_profile(base).model_copy(
        update={"scheduling_policy": "priority" if priority else "fcfs"}
    )
    path = folder / f"profile-{profile.scheduling_policy}.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump()))
    return path


@contextlib.contextmanager
def arm_env(spec: ArmSpec, setup: Setup) -> Iterator[ArmEnv]:
    """Start what the arm needs; stop all of it on the way out (Ctrl-C included)."""
    with tempfile.TemporaryDirectory(prefix="fairq-bench-") as folder:
        sims: dict[int, str] = {}
        profiles: dict[int, str] = {}
        engine_url = setup.engine_url
        if engine_url is None:
            port = free_port()
            sims, engine_url = {port: setup.model}, f"http://127.0.0.1:{port}"
            profiles = {port: str(write_profile(setup.profile, spec.engine_priority, Path(folder)))}
        stack = None
        if spec.via_fairq:
            stack = Stack(
                fairq_config(spec, setup, engine_url), gateway_port=free_port(), sims=sims,
                sim_profiles=profiles, workers=WORKERS,
                env={**_QUIET, "FAIRQ_WORKER_CONCURRENCY": str(worker_slots(setup.scenario))},
            )  # fmt: skip
        elif sims:
            stack = Stack({}, gateway_port=0, sims=sims, sim_profiles=profiles, workers=0,
                          dispatchers=0, gateway=False)  # fmt: skip
        with _running(stack):
            yield ArmEnv(_target(spec, setup, engine_url, stack), engine_url, stack)


@contextlib.contextmanager
def _running(stack: Stack | None) -> Iterator[None]:
    if stack is None:
        yield
        return
    stack.start(START_TIMEOUT_S)  # stops what it started if it fails
    try:
        yield
    finally:
        stack.stop()


def _target(spec: ArmSpec, setup: Setup, engine_url: str, stack: Stack | None) -> Target:
    if spec.via_fairq and stack is not None:
        url = f"{stack.gateway_url}/v1/chat/completions"
        return Target(url, setup.model, keys=user_keys(setup.scenario))
    url = f"{engine_url}/v1/chat/completions"
    return Target(url, setup.model, priorities=spec.client_priorities)


def fairq_priority_problem() -> str | None:
    """Why fairq does not pass priorities to the engine (None: it does).

    Probe: fairq with ``engine_priority`` in front of a small FCFS simulator. An
    engine without priority scheduling refuses any nonzero priority with a 400, so a
    refusal proves fairq sent one; a batch-band job must get a nonzero priority.
    """
    port = free_port()
    setup = Setup(Scenario(power_requests=1, light_users=0), "default", None, SIM_MODEL)
    config = fairq_config(ARMS["f"], setup, f"http://127.0.0.1:{port}")
    stack = Stack(config, gateway_port=free_port(), sims={port: SIM_MODEL}, workers=1, env=_QUIET)
    key = user_keys(setup.scenario)[IDLE_USER]
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    try:
        with _running(stack):
            for band in ("batch", "default", "interactive"):
                headers = {"Authorization": f"Bearer {key}", "X-Fairq-Band": band}
                url = f"{stack.gateway_url}/v1/chat/completions"
                response = httpx.post(url, json=body, headers=headers, timeout=30.0)
                if _NO_PRIORITY_SCHEDULING in response.text:
                    return None
    except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
        return f"the engine-priority probe failed: {exc}"
    return "fairq passed no priority to the engine (a probe in every band reached it without one)"
