"""An engine, described once: where it is, its kind and scheduling policy, and how fairq
admits to it.

``EngineSettings`` are the settings one engine has one of; an entry of ``engines``
(``EngineConfig``) holds them once, under a name the models it serves give as their
``engine``, and each of those models carries them resolved (``ModelConfig``,
``broker.settings.resolve``). Only where the engine is needs saying: its capacity is
learned from its metrics and fairq's own signals, so the rest are overrides a default
deployment never sets.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from broker.errors import SettingError
from broker.settings._base import Frozen
from broker.settings.discovery import DiscoveryConfig

EngineKind = Literal["vllm", "sglang", "tgi", "llamacpp", "openai"]
KINDS: tuple[str, ...] = get_args(EngineKind)

# Seed defaults: the engine queue each band may fill; batch only when the queue is empty.
DEFAULT_QUEUE_TARGETS = {"interactive": 3, "default": 3, "batch": 1}
_FALLBACK_QUEUE_TARGET = 3

_ENGINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class EngineSettings(Frozen):
    """The settings of one engine (``broker.engines.ENGINE_WIDE``: models that share an
    engine agree on each), but its kind and scheduling, which ``EngineConfig`` and the old
    form of ``ModelConfig`` name differently."""

    endpoints: tuple[str, ...] = Field(
        default=(), description="One base URL per engine pod (no /v1)."
    )
    discovery: DiscoveryConfig | None = Field(
        default=None,
        description="Or (and) the engine's replicas found through DNS, followed live: one "
        'endpoint per A/AAAA record of a name (docs/operations.md, "Replicas found through '
        'DNS").',
    )
    admission: Literal["metrics", "static"] | None = Field(
        default=None,
        description="metrics: backpressure from the engine's /metrics; static: the "
        "in-flight cap alone; null: metrics, static for kind openai (no metrics fairq reads).",
    )
    queue_targets: dict[str, int] = Field(
        default_factory=dict,
        description="Band -> the engine queue that band may fill; a band not named: "
        "interactive 3, default 3, batch 1 (batch only while the queue is empty).",
    )
    tpot_ceiling_ms: float = Field(
        default=150.0,
        gt=0,
        description="No admissions while the engine's recent time per output token is above this.",
    )
    inflight_cap: int = Field(
        default=8,
        ge=1,
        description="Jobs in flight per endpoint while its metrics are stale (always, with "
        "admission static).",
    )
    batch_slots: int | None = Field(
        default=None,
        ge=0,
        description="The engine's batch per endpoint, the requests it runs at once (vLLM's "
        "--max-num-seqs): users with a job in the engine are admitted only into free "
        "slots, so the engine's own queue never holds theirs and whoever fairq picks next "
        "is next in the engine too. null: learned from the metrics once the engine is seen "
        "full; 0: no batch rule (the queue targets alone).",
    )
    reserved_slots: int | None = Field(
        default=None,
        ge=0,
        description="Batch slots kept for users with nothing in the engine, so that a "
        "newcomer never waits for another user's generation to end. null: one from 32 "
        "slots up (a smaller batch keeps none: its newcomer waits for the next free slot, "
        "at the head of the engine's queue); 0: none.",
    )
    preemption: bool = Field(
        default=True,
        description="When a user with nothing in the engine finds no free batch slot, take "
        "a job of the user with the most there back out of the engine (one that has sent "
        "nothing yet: it starts again later), so that the newcomer runs at the next step.",
    )
    clear_newcomer_step: bool = Field(
        default=True,
        description="For two engine steps after a newcomer is sent to an endpoint, users "
        "already in the engine send nothing more there (with preemption, their jobs sent "
        "within those steps without output are taken back), so that their prompts do not "
        "lengthen its prefill step. Needs the batch rule and the metrics.",
    )
    pace_refills: bool = Field(
        default=True,
        description="Refill the batch for users already in the engine one more per engine "
        "step than requests end in one (so a batch with free slots grows), spread over the "
        "step, rather than in a burst whenever slots free (a burst makes one long prefill "
        "step, which a newcomer arriving then waits out). Needs the batch rule and the "
        "metrics.",
    )
    routing: Literal["least_loaded", "prefix"] = Field(
        default="least_loaded",
        description="Which replica with room a job goes to: least_loaded (the most room), "
        "or prefix: each user's jobs to one replica, where its prefix cache holds their "
        "conversation (for chat and agents; with several replicas no job is sent express, "
        "and prompts that share nothing only pay for it: docs/performance.md).",
    )
    routing_load_bound: float = Field(
        default=1.25,
        ge=1.0,
        description="prefix routing: a replica takes its users' jobs while its jobs in "
        "flight stay within this times the mean, else the next one does.",
    )

    @field_validator("endpoints")
    @classmethod
    def _valid_endpoints(cls, endpoints: tuple[str, ...]) -> tuple[str, ...]:
        for url in endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint {url!r} must be an http:// or https:// base URL")
        return tuple(url.rstrip("/") for url in endpoints)

    @model_validator(mode="after")
    def _mechanisms_have_what_they_need(self) -> EngineSettings:
        # Only when both are written: the defaults switch a mechanism off quietly where it
        # cannot work (dispatcher.stages), and the user asked for nothing.
        given = self.model_fields_set
        lacking = [
            reason
            for setting, off, reason in (
                ("batch_slots", 0, "batch_slots: 0 turns the batch rule off"),
                ("admission", "static", "admission: static reads no metrics"),
            )
            if setting in given and getattr(self, setting) == off
        ]
        for mechanism in ("clear_newcomer_step", "pace_refills"):
            if lacking and mechanism in given and getattr(self, mechanism):
                raise SettingError(
                    (mechanism,),
                    f"true needs the batch rule and the engine's metrics, and {lacking[0]}: "
                    "remove one of the two",
                )
        return self

    def queue_target(self, band: str) -> int:
        if band in self.queue_targets:
            return self.queue_targets[band]
        return DEFAULT_QUEUE_TARGETS.get(band, _FALLBACK_QUEUE_TARGET)


def require_place(noun: str, name: str, engine: EngineSettings) -> None:
    """Raises unless ``engine`` says where it is (``noun`` ``name``: what the error calls
    its entry)."""
    if not engine.endpoints and engine.discovery is None:
        raise ValueError(
            f"{noun} {name!r} needs endpoints (a list of base URLs), discovery "
            "(a DNS name whose records are its replicas), or both"
        )


class EngineConfig(EngineSettings):
    """An entry of ``engines``: one engine (one or more replicas of one server), named so
    that models can name it."""

    name: str = Field(
        description="The name models give as their engine: letters, digits and . _ - "
        "(not a kind, such as vllm)."
    )
    kind: EngineKind = Field(
        default="vllm",
        description="vllm gets fairq's job id as request_id and may resume a cut stream "
        "(both vLLM-only); sglang, tgi and llamacpp get plain OpenAI-compatible requests "
        "and metrics admission; openai (any OpenAI-compatible server, without metrics "
        "fairq reads) gets the static in-flight cap unless admission says otherwise. The "
        "/metrics are read by the names found on the page whatever this says.",
    )
    scheduling: Literal["fcfs", "priority"] = Field(
        default="fcfs",
        description="The engine's own scheduling policy (vLLM's --scheduling-policy): "
        "fcfs, or priority: fairq then sends each request a priority, band first, then the "
        "user's jobs in the engine (kind vllm only).",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _ENGINE_NAME.match(name):
            raise ValueError(
                f"engine name {name!r} must start with a letter or digit and use only "
                "letters, digits and . _ - (at most 100 characters)"
            )
        if name in KINDS:
            raise ValueError(
                f"engine name {name!r} is a kind of engine, which a model's engine: would "
                "read as the old form: name the engine after its place, such as gpu-a, and "
                f"give it kind: {name}"
            )
        return name

    @model_validator(mode="after")
    def _check_engine(self) -> EngineConfig:
        require_place("engine", self.name, self)
        if self.scheduling == "priority" and self.kind != "vllm":
            raise SettingError(
                ("scheduling",),
                f"priority is vLLM's (--scheduling-policy priority): a {self.kind} engine "
                "is sent no priorities; remove it, or set kind: vllm",
            )
        return self
