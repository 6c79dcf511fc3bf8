"""What ``fairq up`` runs: the demo stack, the user's own configuration, or the demo keys
in front of an engine given by its URL.

``demo_plan``: two simulated engines and the demo keys. ``file_plan``: the models, keys
and engines of a configuration file (checked first, each problem with its line), no
simulator. ``engine_plan``: one model served by any OpenAI-compatible engine (a real
vLLM); its name is asked of the engine's ``/v1/models`` when not given, and its kind
from its ``/metrics``: vLLM's or TGI's queue gauge means backpressure from the metrics,
none means the static in-flight cap (``ModelConfig.admission_policy``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from broker import Settings
from broker.settings import KINDS
from fairq.stack.localredis import free_port
from fairq.stack.processes import (
    DEMO_ADMIN_KEY,
    DEMO_KEYS,
    DEMO_MODELS,
    demo_api_keys,
    demo_config,
)

_PROBE_TIMEOUT_S = 5.0
ENGINES = KINDS  # what --engine may name, beside auto
# The queue gauge that names an engine's kind (dispatcher/engine_metrics.py).
_QUEUE_GAUGES = {
    "vllm": "vllm:num_requests_waiting",
    "sglang": "sglang:num_queue_reqs",
    "tgi": "tgi_queue_size",
    "llamacpp": "llamacpp:requests_deferred",
}


class PlanError(Exception):
    """``fairq up`` cannot run what it was asked to; each line says why."""

    def __init__(self, *lines: str) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class Plan:
    """A stack to start and what its banner says of it."""

    config: dict[str, Any] = field(default_factory=dict)  # written for the stack, or
    config_file: Path | None = None  # the user's own file, read as it is
    sims: dict[int, str] = field(default_factory=dict)  # simulator port -> model
    redis_url: str | None = None  # from the configuration; None: a private Redis
    models: tuple[str, ...] = ()  # one line each: name, engine, endpoints
    keys: tuple[str, ...] = ()  # one line each: a key (or its user) and what it may do
    try_key: str = "YOUR_KEY"
    try_model: str = ""
    admin_key: str | None = None
    notes: tuple[str, ...] = ()


def _demo_keys() -> tuple[str, ...]:
    lines = [f"{key}  user={user} tenant={tenant}" for key, (user, tenant) in DEMO_KEYS.items()]
    return (*lines, f"{DEMO_ADMIN_KEY}  admin (the dashboard, /v1/admin)")


def demo_plan(sim_port: int | None) -> Plan:
    ports = [sim_port + i if sim_port else free_port() for i in range(len(DEMO_MODELS))]
    return Plan(
        # Nothing about the engines is told: fairq learns their capacity, as a default
        # deployment does (the simulator's default profile runs 32 at once).
        config=demo_config(ports),
        sims=dict(zip(ports, DEMO_MODELS, strict=True)),
        models=tuple(
            f"{name}  simulated engine at http://127.0.0.1:{port} (timings are estimates)"
            for port, name in zip(ports, DEMO_MODELS, strict=True)
        ),
        keys=_demo_keys(),
        try_key=next(iter(DEMO_KEYS)),
        try_model=DEMO_MODELS[0],
        admin_key=DEMO_ADMIN_KEY,
    )


def file_plan(path: Path) -> Plan:
    """The user's configuration file as it is: checked (with the environment over it, as
    every process reads it), never rewritten."""
    from fairq.config_check import check_file, check_with_environment, notes

    path = path.resolve()
    settings, problems = check_file(path)
    if settings is not None:
        settings, problems = check_with_environment(path)
    if settings is None:
        raise PlanError(*(p.render(path) for p in problems))
    if not settings.models:
        raise PlanError(f"{path}: lists no models: nothing to serve (fairq.example.yaml)")
    return Plan(
        config_file=path,
        redis_url=None if settings.redis_url is None else settings.redis_url.get_secret_value(),
        models=tuple(_model_line(settings, i) for i in range(len(settings.models))),
        keys=_file_keys(settings),
        try_model=settings.models[0].name,
        notes=tuple(notes(settings, redis=False)),
    )


def _file_keys(settings: Settings) -> tuple[str, ...]:
    if not settings.api_keys:
        return ()
    users = ", ".join(k.user for k in settings.api_keys)
    return (f"users {users} (your keys: the file holds only their sha256)",)


def _model_line(settings: Settings, index: int) -> str:
    model = settings.models[index]
    at = list(model.endpoints)
    if model.discovery is not None:
        at.append(f"the replicas of DNS {model.discovery.dns} port {model.discovery.port}")
    return f"{model.name}  {model.engine} ({model.admission_policy} admission) at {', '.join(at)}"


def engine_base(url: str) -> str:
    """An engine's base URL as fairq wants it: no trailing ``/`` nor ``/v1``."""
    base = url.rstrip("/")
    return base.removesuffix("/v1")


def engine_plan(urls: tuple[str, ...], model: str | None, engine: str) -> Plan:
    """The demo keys in front of the engine(s) at ``urls``, all serving one model."""
    bases = tuple(engine_base(u) for u in urls)
    for base in bases:
        if not base.startswith(("http://", "https://")):
            raise PlanError(f"--engine-url {base!r}: an http:// or https:// URL, please")
    notes: list[str] = []
    if model is None:
        model, notes = _ask_model(bases[0])
    kind, why = (engine, "--engine") if engine != "auto" else detect_engine(bases[0])
    config: dict[str, Any] = {
        "engines": [{"name": "engine", "kind": kind, "endpoints": list(bases)}],
        "models": [{"name": model, "engine": "engine"}],
        "api_keys": demo_api_keys(),
    }
    admission = "the in-flight cap alone" if kind == "openai" else "backpressure from /metrics"
    notes.append(f"{bases[0]}: {kind} ({why}): admission by {admission}")
    return Plan(
        config=config,
        models=(f"{model}  {kind} engine at {', '.join(bases)}",),
        keys=_demo_keys(),
        try_key=next(iter(DEMO_KEYS)),
        try_model=model,
        admin_key=DEMO_ADMIN_KEY,
        notes=tuple(notes),
    )


def _ask_model(base: str) -> tuple[str, list[str]]:
    url = f"{base}/v1/models"
    try:
        response = httpx.get(url, timeout=_PROBE_TIMEOUT_S)
        response.raise_for_status()
        served = [str(m["id"]) for m in response.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise PlanError(
            f"cannot ask {url} which model it serves ({type(exc).__name__}: {exc}); "
            "is the engine running? (--model NAME starts without asking)"
        ) from exc
    if not served:
        raise PlanError(f"{url} lists no model; name it with --model NAME")
    notes = []
    if len(served) > 1:
        notes.append(f"the engine serves {', '.join(served)}: fairq serves {served[0]} "
                     "(--model NAME picks another)")  # fmt: skip
    return served[0], notes


def detect_engine(base: str) -> tuple[str, str]:
    """The engine's kind from its ``/metrics`` (the queue gauge of vLLM, SGLang, TGI or
    llama.cpp), and how it was found; ``openai`` (no metrics fairq reads) when none is."""
    try:
        text = httpx.get(f"{base}/metrics", timeout=_PROBE_TIMEOUT_S).text
    except httpx.HTTPError as exc:
        return "openai", f"its /metrics did not answer: {type(exc).__name__}"
    for kind, gauge in _QUEUE_GAUGES.items():
        if gauge in text:
            return kind, f"its /metrics has {gauge}"
    return "openai", "its /metrics has no queue gauge fairq reads"
