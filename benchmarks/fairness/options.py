"""From the benchmark's flags to its options, refusing what cannot run before any arm.

Resolved here, once: which engine every arm gets (and the context its model
serves: the simulator's profile, the tiny vLLM's 512 tokens, or the user's
engine's GET /v1/models, and its scheduling policy: stated, or said on its
/server_info, or unknown), the size presets (``h100`` with the simulator,
``tiny`` with vLLM, with ``--engine-url`` the first that fits), each scenario's
sizes with the flags given, and whether the cores can be pinned. A scenario that
does not fit the context, an engine that cannot be reached, or a flag that does
not go with the others is a usage error, said before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx

from benchmarks.fairness.arms import ArmSpec, parse_arms
from benchmarks.fairness.scenarios import (
    Scenario,
    build,
    context_problem,
    family_for,
    parse_names,
    parse_range,
    parse_weights,
)
from benchmarks.lib.cpu import ENGINE_CPUS, FAIRQ_CPUS, pinning_problem
from benchmarks.lib.engine_watch import reported_policy, served_models
from benchmarks.lib.provision import (
    REPORTED,
    SIM_MODEL,
    STATED,
    UNKNOWN,
    VLLM_CONTEXT,
    VLLM_MODEL,
    EngineChoice,
    KnownPolicy,
    sim_context,
    vllm_home,
)


@dataclass(frozen=True)
class Options:
    scenarios: list[Scenario]
    arms: list[ArmSpec]
    engine: EngineChoice
    out: Path
    arm_timeout_s: float


@dataclass(frozen=True)
class EngineFlags:
    kind: str  # --engine: sim or vllm
    profile: str
    url: str | None
    policy: str | None
    model: str | None
    pinning: bool | None
    vllm_home: str | None
    batch: int | None = None  # --engine-batch
    kv_tokens: int | None = None  # --engine-kv-tokens


def engine_choice(flags: EngineFlags) -> EngineChoice:
    """The engine of the run, with its served context; UsageError when it cannot be."""
    if flags.url is None and (flags.policy or flags.model):
        raise click.UsageError("--engine-policy and --model go with --engine-url")
    if flags.url is not None and flags.kind != "sim":
        raise click.UsageError("--engine-url runs the user's engine: leave out --engine vllm")
    if flags.kv_tokens is not None and (flags.url is not None or flags.kind != "sim"):
        raise click.UsageError("--engine-kv-tokens sizes the simulator's KV cache: only with sim")
    pinning = flags.kind == "vllm" if flags.pinning is None else flags.pinning
    problem = pinning_problem(ENGINE_CPUS | FAIRQ_CPUS) if pinning else None
    if problem is not None:
        raise click.UsageError(f"{problem}; run with --no-cpu-pinning")
    if flags.url is not None:
        return _url_choice(flags, pinning)
    if flags.kind == "vllm":
        home = vllm_home(flags.vllm_home)
        return EngineChoice("vllm", VLLM_MODEL, VLLM_CONTEXT, pinning=pinning, vllm_home=home,
                            batch=flags.batch)  # fmt: skip
    context = _sim_context(flags.profile)
    if flags.kv_tokens is not None:
        context = min(context, flags.kv_tokens)  # as write_profile serves it
    return EngineChoice("sim", SIM_MODEL, context, profile=flags.profile, pinning=pinning,
                        batch=flags.batch, kv_tokens=flags.kv_tokens)  # fmt: skip


def _sim_context(profile: str) -> int:
    from sim import ProfileError

    try:
        return sim_context(profile)
    except ProfileError as exc:
        raise click.BadParameter(str(exc), param_hint="--profile") from exc


def _url_choice(flags: EngineFlags, pinning: bool) -> EngineChoice:
    url = str(flags.url).rstrip("/")
    try:
        models = served_models(url)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise click.UsageError(f"cannot read the models of {url}/v1/models: {exc}") from exc
    model = flags.model or next(iter(models))
    if model not in models:
        raise click.UsageError(f"the engine at {url} serves {sorted(models)}, not {model!r}")
    policy = _known_policy(url, flags.policy)
    return EngineChoice("url", model, models[model], url=url, policy=policy, pinning=pinning,
                        batch=flags.batch)  # fmt: skip


def _known_policy(url: str, stated: str | None) -> KnownPolicy:
    """The policy of the user's engine: as stated, else as the engine says it; an engine
    that says another than the one stated is a usage error."""
    said = reported_policy(url)
    if stated is not None and said is not None and said != stated:
        raise click.UsageError(
            f"--engine-policy {stated}, but the engine at {url} says on its /server_info "
            f"that it runs {said}"
        )
    if stated is not None:
        return KnownPolicy(stated, STATED)
    return UNKNOWN if said is None else KnownPolicy(said, REPORTED)


def scenarios(names: tuple[str, ...], family: str | None, engine: EngineChoice,
              sizes: dict[str, Any]) -> list[Scenario]:  # fmt: skip
    """The scenarios with the flags given; UsageError when one does not fit the context."""
    try:
        chosen = parse_names(names)
        flags = _size_flags(sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if family is None:
        family = _default_family(chosen, engine)
    try:
        built = [build(name, family, flags) for name in chosen]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    context = engine.max_model_len
    problems = [p for s in built if context and (p := context_problem(s, context))]
    if problems:
        raise click.UsageError("the scenario does not fit the engine: " + "; ".join(problems))
    return built


def _default_family(names: list[str], engine: EngineChoice) -> str:
    if engine.kind == "vllm":
        return "tiny"
    if engine.kind == "url" and engine.max_model_len is not None:
        return family_for(names, engine.max_model_len)
    return "h100"


def _size_flags(sizes: dict[str, Any]) -> dict[str, Any]:
    flags = dict(sizes)
    if flags.get("long_output_tokens") is not None:
        flags["long_output_tokens"] = parse_range(flags["long_output_tokens"])
    if flags.get("heavy_weights") is not None:
        flags["heavy_weights"] = parse_weights(flags["heavy_weights"])
    return flags


def arms(text: str) -> list[ArmSpec]:
    try:
        return parse_arms(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--arms") from exc
