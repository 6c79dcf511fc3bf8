"""The engine each arm talks to: a fresh simulator, a fresh real vLLM, or the user's.

``--engine sim`` (the default) starts a simulator per arm from a temporary copy
of the chosen profile with the arm's scheduling policy; ``--engine vllm`` starts
a real vLLM per arm (``benchmarks.lib.vllm_engine``, imported only then: it installs
about 2.5 GB) with the tiny model, 8 batch slots and 512 tokens of context;
``--engine-url`` uses the engine the user started, as it is. Whatever starts is
stopped when the arm ends, Ctrl-C included.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.lib.cpu import ENGINE_CPUS
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack

SIM_MODEL = "sim-model"
VLLM_MODULE = "benchmarks.lib.vllm_engine"
VLLM_MODEL = "tiny"
VLLM_SLOTS = 8
VLLM_CONTEXT = 512
START_TIMEOUT_S = 60.0
WORKERS = 2  # fairq workers per arm's stack
MIN_WORKER_SLOTS = 300


@dataclass(frozen=True)
class KnownPolicy:
    """The scheduling policy an arm's engine runs (None: not known), and how it is known."""

    name: str | None
    how: str

    @property
    def label(self) -> str:
        if self.name is None:
            return "engine policy unknown, no priorities sent"
        return f"engine {self.name}, {self.how}"


STARTED = "as started"  # the benchmark started the engine with it
STATED = "per --engine-policy"
REPORTED = "per its /server_info"
UNKNOWN = KnownPolicy(None, "not stated, and the engine does not say")


@dataclass(frozen=True)
class EngineChoice:
    """Which engine every arm of the run gets."""

    kind: str  # "sim", "vllm" or "url"
    model: str
    max_model_len: int | None  # the served model's context (None: not said)
    profile: str = "h100-8b"  # the simulator's
    url: str | None = None  # kind "url"
    policy: KnownPolicy = UNKNOWN  # kind "url": stated, or said by the engine
    pinning: bool = False  # the engine on ENGINE_CPUS, everything else on FAIRQ_CPUS
    vllm_home: Path | None = None
    batch: int | None = None  # its max_num_seqs, if not the profile's or VLLM_SLOTS
    kv_tokens: int | None = None  # the simulator's KV cache, if not the profile's

    @property
    def label(self) -> str:
        told = "; fairq's arms learn its capacity from its metrics"
        if self.batch_slots is not None:
            told += f", but for arm (t), told its batch (batch_slots {self.batch_slots})"
        if self.kind == "sim":
            sized = f", max_num_seqs {self.batch}" if self.batch else ""
            sized += f", KV cache {self.kv_tokens} tokens" if self.kv_tokens else ""
            return f"engine simulator, profile {self.profile}{sized}{told}"
        if self.kind == "vllm":
            return (
                f"real vLLM per arm ({self.model}: {self.vllm_slots} slots, context "
                f"{VLLM_CONTEXT}){told}"
            )
        return f"engine at {self.url} (model {self.model}){told}"

    @property
    def note(self) -> str:
        """What the figures are worth, for the report's last line."""
        if self.kind == "sim":
            return (
                "Simulator figures are estimates: the simulator models an engine's batching "
                "and queueing from a profile; it is not a GPU."
            )
        if self.kind == "vllm":
            return "A real vLLM (CPU build, tiny model) per arm; figures as measured."
        policy = self.policy
        if policy.name is not None:
            return (
                "The engine at --engine-url, as its owner started it; its scheduling policy: "
                f"{policy.name}, {policy.how}."
            )
        return (
            "The engine at --engine-url, as its owner started it. Its scheduling policy is "
            "unknown: --engine-policy does not say it, and neither does the engine (vLLM says "
            "it only on /server_info, with VLLM_SERVER_DEV_MODE=1). The arms that send "
            "priorities did not run; the others send none, which any policy serves in "
            "arrival order."
        )

    @property
    def vllm_slots(self) -> int:
        return self.batch or VLLM_SLOTS

    @property
    def batch_slots(self) -> int | None:
        """The engine's batch (its max_num_seqs), as an operator who knows it would tell
        fairq (arm t), or None for the user's own engine when not given (--engine-batch)."""
        if self.kind == "sim":
            from sim import load_profile

            return self.batch or load_profile(self.profile).max_num_seqs
        return self.vllm_slots if self.kind == "vllm" else self.batch

    def ran(self, needs: str) -> KnownPolicy:
        """The policy the arm's engine runs: the one it was started with (a fresh engine
        per arm), or the user's engine's as far as it is known."""
        return self.policy if self.kind == "url" else KnownPolicy(needs, STARTED)


@dataclass(frozen=True)
class Engine:
    url: str
    dead: Callable[[], str | None]


def worker_slots(requests: int) -> int:
    """Each worker's concurrency (``FAIRQ_WORKER_CONCURRENCY``) so that ``requests`` open
    at once never wait for a worker: the workers share them, with a margin."""
    return max(MIN_WORKER_SLOTS, -(-requests // WORKERS) + 8)


def vllm_home(given: str | None) -> Path:
    """``--vllm-home``, else $FAIRQ_VLLM_HOME, else ``.vllm`` at the repository root."""
    home = given or os.environ.get("FAIRQ_VLLM_HOME")
    return Path(home) if home else Path(__file__).resolve().parents[2] / ".vllm"


def vllm_module() -> Any:
    """``benchmarks.lib.vllm_engine``; a RuntimeError saying so when it is not there."""
    if importlib.util.find_spec(VLLM_MODULE) is None:
        raise RuntimeError(f"--engine vllm needs {VLLM_MODULE} (benchmarks/lib/vllm_engine.py)")
    return importlib.import_module(VLLM_MODULE)


def _vllm_error(module: Any) -> type[Exception]:
    error = getattr(module, "VllmEngineError", RuntimeError)
    return error if isinstance(error, type) and issubclass(error, Exception) else RuntimeError


def prepare_vllm(home: Path) -> None:
    """Install vLLM and build the tiny model once, before any arm (minutes the first time);
    a RuntimeError when that fails."""
    module = vllm_module()
    try:
        module.ensure_installed(home)
        module.ensure_model(home)
    except _vllm_error(module) as exc:
        raise RuntimeError(str(exc)) from exc


@contextlib.contextmanager
def engine_for(choice: EngineChoice, policy: str, folder: Path) -> Iterator[Engine]:
    """The arm's engine, running ``policy`` (fresh ones), until the block ends."""
    if choice.kind == "url":
        assert choice.url is not None
        yield Engine(choice.url, lambda: None)
    elif choice.kind == "sim":
        with _simulator(choice, policy, folder) as engine:
            yield engine
    else:
        with _vllm(choice, policy) as engine:
            yield engine


@contextlib.contextmanager
def _vllm(choice: EngineChoice, policy: str) -> Iterator[Engine]:
    """A fresh vLLM; its module's own error on the way in becomes a RuntimeError."""
    module = vllm_module()
    cpus = set(ENGINE_CPUS) if choice.pinning else None
    running = module.running_vllm(
        choice.vllm_home or vllm_home(None), port=free_port(), policy=policy,
        max_num_seqs=choice.vllm_slots, max_model_len=VLLM_CONTEXT, served_name=VLLM_MODEL,
        cpus=cpus,
    )  # fmt: skip
    with contextlib.ExitStack() as on_exit:
        try:
            url = on_exit.enter_context(running)
        except _vllm_error(module) as exc:
            raise RuntimeError(f"vLLM did not start: {exc}") from exc
        yield Engine(str(url).rstrip("/"), lambda: None)


@contextlib.contextmanager
def _simulator(choice: EngineChoice, policy: str, folder: Path) -> Iterator[Engine]:
    port = free_port()
    profile = str(write_profile(choice, policy, folder))
    stack = Stack({}, gateway_port=0, sims={port: choice.model}, sim_profiles={port: profile},
                  workers=0, dispatchers=0, gateway=False)  # fmt: skip
    stack.start(START_TIMEOUT_S)  # stops what it started if it fails
    try:
        yield Engine(f"http://127.0.0.1:{port}", stack.dead)
    finally:
        stack.stop()


def write_profile(choice: EngineChoice, policy: str, folder: Path) -> Path:
    """The chosen profile with the arm's scheduling policy and the sizes chosen, as a YAML
    file."""
    from sim import load_profile

    update: dict[str, Any] = {"scheduling_policy": policy}
    if choice.batch is not None:
        update["max_num_seqs"] = choice.batch
    base = load_profile(choice.profile)
    if choice.kv_tokens is not None:
        # vLLM refuses a context its KV cache cannot hold: it is served shorter.
        update["kv_cache_tokens"] = choice.kv_tokens
        update["max_model_len"] = min(base.max_model_len, choice.kv_tokens)
    profile = base.model_copy(update=update)
    path = folder / f"profile-{policy}.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump()))
    return path


def sim_context(profile: str) -> int:
    """The context the simulator will serve with this profile (its /v1/models says the same)."""
    from sim import load_profile

    return load_profile(profile).max_model_len
