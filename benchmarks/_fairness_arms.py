"""The arms of the fairness benchmark and whether each can run here.

Every arm serves the same scenario on the same engine profile; they differ in
the path (straight to the engine, or through fairq), fairq's model settings,
and whether the engine schedules by priority:

(a) the engine alone, FIFO: the baseline every figure is compared with;
(b) fairq round-robin without backpressure: static admission with a cap no
    burst reaches, so fairq passes everything on at once and the engine's FIFO
    decides;
(c) fairq with backpressure from the engine's metrics (the defaults);
(d) as (c) with the ``token_fair`` policy;
(e) the engine alone with priority scheduling, light users at priority 0;
(f) as (c) with ``engine_priority``: fairq passes a priority to the engine.

An arm whose fairq feature is missing or whose engine cannot schedule by
priority is reported "not available: <reason>", never run half-way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import ValidationError


@dataclass(frozen=True)
class ArmSpec:
    key: str
    title: str
    via_fairq: bool
    engine_priority: bool = False  # the engine runs --scheduling-policy priority
    backpressure: bool = True  # False: fairq holds nothing back
    model_overrides: Mapping[str, Any] = field(default_factory=dict)  # fairq's model config

    @property
    def client_priorities(self) -> bool:
        """The client itself sets `priority` (the direct arm with a priority engine)."""
        return self.engine_priority and not self.via_fairq


ARMS: dict[str, ArmSpec] = {
    arm.key: arm
    for arm in (
        ArmSpec("a", "engine FIFO (direct)", via_fairq=False),
        ArmSpec("b", "fairq round-robin, no backpressure", via_fairq=True, backpressure=False),
        ArmSpec("c", "fairq + backpressure", via_fairq=True),
        ArmSpec(
            "d",
            "fairq + backpressure + token_fair",
            via_fairq=True,
            model_overrides={"policy": "token_fair"},
        ),
        ArmSpec("e", "engine priority (direct)", via_fairq=False, engine_priority=True),
        ArmSpec(
            "f",
            "fairq + backpressure + engine priority",
            via_fairq=True,
            engine_priority=True,
            model_overrides={"engine_priority": True},
        ),
    )
}


def parse_arms(text: str) -> list[ArmSpec]:
    keys = [k.strip().lower() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ARMS]
    if unknown or not keys:
        raise ValueError(f"unknown arm(s) {unknown or text!r}; choose from {','.join(ARMS)}")
    return [ARMS[k] for k in dict.fromkeys(keys)]


def model_config(spec: ArmSpec, model: str, engine_url: str, requests: int) -> dict[str, Any]:
    """fairq's settings for the arm's model; ``requests``: the most the scenario sends."""
    config = {"name": model, "engine": "vllm", "endpoints": [engine_url], **spec.model_overrides}
    if not spec.backpressure:
        # A cap as high as the scenario's requests, not "infinite": the dispatcher plans
        # `cap - in flight` picks a round however few jobs are queued, and a cap of
        # 100,000 made every round take about a second.
        config |= {"admission": "static", "inflight_cap": max(requests, 1)}
    return config


def config_problem(spec: ArmSpec, model: str, engine_url: str) -> str | None:
    """Why fairq as installed cannot run this arm's model settings (None: it can)."""
    if not spec.via_fairq:
        return None
    from broker import ModelConfig
    from dispatcher.fairness import POLICIES

    try:
        config = ModelConfig.model_validate(model_config(spec, model, engine_url, 1))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"fairq rejects the model setting {where!r}: {first['msg']}"
    if config.policy not in POLICIES:
        return f"the dispatcher has no fairness policy {config.policy!r}"
    return None


def engine_priority_problem(engine_url: str, model: str) -> str | None:
    """Why the engine cannot schedule by priority (None: it can). vLLM started without
    --scheduling-policy priority rejects a nonzero priority with a 400."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
        "priority": 1,
    }
    try:
        response = httpx.post(f"{engine_url}/v1/chat/completions", json=body, timeout=60.0)
    except httpx.HTTPError as exc:
        return f"the engine at {engine_url} did not answer a priority request: {exc}"
    if response.status_code == 200:
        return None
    return (
        f"the engine at {engine_url} refused a priority request (HTTP {response.status_code}: "
        f"{_error_message(response)}); start vLLM with --scheduling-policy priority for this arm"
    )


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])[:160]
    except (ValueError, KeyError, TypeError):
        return response.text[:160]
