"""The arms of the fairness benchmark and whether each can run here.

Every arm serves the same scenario on the same engine; they differ in the path
(straight to the engine, or through fairq), fairq's model settings, and whether
the engine schedules by priority:

(a) the engine alone, FIFO: the baseline every figure is compared with;
(b) fairq round-robin without backpressure: static admission with a cap no
    burst reaches, so fairq passes everything on at once and the engine's FIFO
    decides;
(c) fairq with its defaults (backpressure from the engine's metrics; its capacity
    learned from them, never told): the main arm;
(d) as (c) with the ``token_fair`` policy;
(e) the engine alone with priority scheduling, light users at priority 0;
(f) as (c) with ``engine_priority``: fairq passes a priority to the engine;
(g) fairq with the queue target only (the admission before batch capacity);
(h) fairq with the batch-capacity rule but no slots kept for newcomers;
(i) as (c) with answers resumed mid-way from token ids (``resume_streams`` exact, now
    also the default: named so that the arm keeps its meaning);
(j) as (c) without mid-answer resume (``resume_streams`` off: preemption takes back only
    jobs that have sent nothing, the default before exact resume);
(k) as (a), each request asking for its token ids (``return_token_ids``) as fairq's
    workers ask for a stream that may be resumed: what that costs the engine alone.
(l) as (c) with the newcomer's prefill step not kept clear (``clear_newcomer_step`` off);
(m) as (c) with refills not paced (``pace_refills`` off);
(n) as (a), but the heavy users' requests go only as the engine's batch frees (at most
    its batch + 1 open at once, as fairq hands them over): what the engine's throughput
    is when a flood arrives over time rather than at t=0, with no fairq process running;
(o) as (c) with answers not streamed to their clients not streamed from the engine either
    (``stream_from_engine`` off): fairq sees their first token only with the whole answer;
(q) as (c) without preemption (``preemption`` off): nothing sent is taken back, so a
    newcomer that finds the batch full waits for a slot to free;
(t) as (c), told the engine's batch as an operator who knows it would (``batch_slots``):
    the hand-tuned stack the defaults are measured against.

An arm whose fairq feature is missing (fairq rejects its model setting) or whose
engine runs the other scheduling policy is reported "not available: <reason>",
never run half-way. Each arm's title says the policy its engine ran and how that is
known (``KnownPolicy``): a fresh engine per arm (simulator or vLLM) is started with
the policy the arm needs; an engine at ``--engine-url`` runs the policy its owner
states with ``--engine-policy``, or the one it says on vLLM's ``/server_info`` (served
only with ``VLLM_SERVER_DEV_MODE=1``; vLLM 0.32 says it nowhere else), else it is
unknown and the arms that send priorities do not run. An error never tells: vLLM 0.32
without the priority policy takes a request's ``priority`` and ignores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from benchmarks.lib.provision import KnownPolicy


@dataclass(frozen=True)
class ArmSpec:
    key: str
    title: str
    via_fairq: bool
    engine_priority: bool = False  # the engine runs --scheduling-policy priority
    backpressure: bool = True  # False: fairq holds nothing back
    model_overrides: Mapping[str, Any] = field(default_factory=dict)  # fairq's model config
    token_ids: bool = False  # direct: each request asks for its token ids
    # direct: the heavy users' requests go only as the engine's batch frees, at most its
    # batch + 1 open at once (as fairq hands them over), with no fairq process running
    heavy_window: bool = False
    told_batch: bool = False  # fairq is told the engine's batch (``batch_slots``)

    @property
    def client_priorities(self) -> bool:
        """The client itself sets `priority` (the direct arm with a priority engine)."""
        return self.engine_priority and not self.via_fairq


_TARGETS_8 = {"interactive": 8, "default": 8}
_TARGETS_16 = {"interactive": 16, "default": 16}

ARMS: dict[str, ArmSpec] = {
    arm.key: arm
    for arm in (
        ArmSpec("a", "engine FIFO (direct)", via_fairq=False),
        ArmSpec("b", "fairq round-robin, no backpressure", via_fairq=True, backpressure=False),
        ArmSpec("c", "fairq defaults", via_fairq=True),
        ArmSpec(
            "d",
            "fairq defaults + token_fair",
            via_fairq=True,
            model_overrides={"policy": "token_fair"},
        ),
        ArmSpec("e", "engine priority (direct)", via_fairq=False, engine_priority=True),
        ArmSpec(
            "f",
            "fairq defaults + engine priority",
            via_fairq=True,
            engine_priority=True,
            model_overrides={"engine_priority": True},
        ),
        ArmSpec(
            "g",
            "fairq, queue target only (no batch rule)",
            via_fairq=True,
            model_overrides={"batch_slots": 0, "reserved_slots": 0},
        ),
        ArmSpec(
            "h",
            "fairq, batch capacity, no kept slots",
            via_fairq=True,
            model_overrides={"reserved_slots": 0},
        ),
        ArmSpec(
            "i",
            "fairq + streams resumed mid-answer, exact",
            via_fairq=True,
            model_overrides={"resume_streams": "exact"},
        ),
        ArmSpec(
            "j",
            "fairq, no mid-answer resume",
            via_fairq=True,
            model_overrides={"resume_streams": "off"},
        ),
        ArmSpec("k", "engine FIFO (direct), token ids asked", via_fairq=False, token_ids=True),
        ArmSpec(
            "l",
            "fairq, newcomer's prefill step not kept clear",
            via_fairq=True,
            model_overrides={"clear_newcomer_step": False},
        ),
        ArmSpec(
            "m",
            "fairq, refills not paced",
            via_fairq=True,
            model_overrides={"pace_refills": False},
        ),
        ArmSpec(
            "n",
            "engine FIFO (direct), the flood sent as slots free",
            via_fairq=False,
            heavy_window=True,
        ),
        ArmSpec(
            "o",
            "fairq, whole answers not streamed from the engine",
            via_fairq=True,
            model_overrides={"stream_from_engine": False},
        ),
        ArmSpec(
            "q",
            "fairq without preemption",
            via_fairq=True,
            model_overrides={"preemption": False},
        ),
        ArmSpec("t", "fairq told the engine's batch", via_fairq=True, told_batch=True),
        # The told stack's overrides swept (docs/performance.md, the 256-slot seed cell)
        ArmSpec(
            "u",
            "fairq told the engine's batch, queue target 8",
            via_fairq=True,
            told_batch=True,
            model_overrides={"queue_targets": _TARGETS_8},
        ),
        ArmSpec(
            "v",
            "fairq told the engine's batch, queue target 16, TPOT ceiling 1 s",
            via_fairq=True,
            told_batch=True,
            model_overrides={"queue_targets": _TARGETS_16, "tpot_ceiling_ms": 1000},
        ),
        ArmSpec(
            "w",
            "fairq told the engine's batch, refills not paced",
            via_fairq=True,
            told_batch=True,
            model_overrides={"pace_refills": False},
        ),
        ArmSpec(
            "x",
            "fairq told the engine's batch, not paced, queue target 16, TPOT ceiling 1 s",
            via_fairq=True,
            told_batch=True,
            model_overrides={
                "pace_refills": False,
                "queue_targets": _TARGETS_16,
                "tpot_ceiling_ms": 1000,
            },
        ),
    )
}
ENGINE_POLICIES = ("fcfs", "priority")


def parse_arms(text: str) -> list[ArmSpec]:
    keys = [k.strip().lower() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ARMS]
    if unknown or not keys:
        raise ValueError(f"unknown arm(s) {unknown or text!r}; choose from {','.join(ARMS)}")
    return [ARMS[k] for k in dict.fromkeys(keys)]


def model_config(
    spec: ArmSpec, model: str, engine_url: str, requests: int, batch_slots: int | None = None
) -> dict[str, Any]:
    """fairq's settings for the arm's model; ``requests``: the most the scenario sends;
    ``batch_slots``: the engine's batch, which an arm that is ``told_batch`` configures as
    an operator who knows it would (the arm's own settings win)."""
    config: dict[str, Any] = {"name": model, "engine": "vllm", "endpoints": [engine_url]}
    config["allow_fields"] = ["ignore_eos"]  # vLLM's, which the load sends (benchmarks.lib.load)
    if spec.told_batch and batch_slots is not None:
        config["batch_slots"] = batch_slots
    config.update(spec.model_overrides)
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


def policy(spec: ArmSpec) -> str:
    """The engine scheduling policy the arm needs."""
    return "priority" if spec.engine_priority else "fcfs"


_SAY = "say --engine-policy priority if it runs vLLM's --scheduling-policy priority"


def policy_problem(spec: ArmSpec, engine_url: str | None, known: KnownPolicy) -> str | None:
    """Why the engine at ``engine_url`` cannot serve the arm (None: it can, or the arm
    gets a fresh engine of its own: ``engine_url`` None). An engine of unknown policy
    serves only the arms that send no priority: any policy serves those in arrival order."""
    if engine_url is None:
        return None
    if known.name is None:
        if spec.engine_priority:
            return (
                f"the scheduling policy of the engine at {engine_url} is unknown (vLLM says "
                f"it only on /server_info, with VLLM_SERVER_DEV_MODE=1): {_SAY}"
            )
        return None
    if known.name != policy(spec):
        return f"the engine at {engine_url} runs {known.name} ({known.how})"
    return None


def arm_title(spec: ArmSpec, known: KnownPolicy, *, runs: bool = True) -> str:
    """The arm's title with the policy its engine ran and how that is known; an arm that
    does not run has no engine to name."""
    return f"{spec.title} [{known.label}]" if runs else spec.title
