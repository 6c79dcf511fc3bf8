"""One served model, as every part of fairq reads it: its own settings and, resolved, its
engine's (``broker.settings.resolve`` copies them from the entry of ``engines`` the model
names)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from broker.settings.engine import EngineKind, EngineSettings, require_place

# How preemption may take a streamed answer back mid-way (``ModelConfig.resume_streams``).
ResumeStreams = Literal["exact", "text", "off"]

# Model names become Redis Cluster hash tags and URL path parts: no braces, no spaces.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")


class ModelConfig(EngineSettings):
    """One served model and the engine that serves it, resolved: its endpoints (listed,
    found through ``discovery``, or both: the union) and every engine setting. Models that
    list the same endpoints (or follow the same DNS name) are names of one engine, counted
    once for all of them (``broker.engines``)."""

    name: str = Field(description='What clients send as "model" (and what the engine serves).')
    # Loaded, this is the kind of the engine named (broker.settings.resolve).
    engine: EngineKind = Field(
        default="vllm",
        description="The entry of engines that serves the model, by its name. The old form, "
        "the engine's kind (vllm, sglang, tgi, llamacpp, openai) with the engine's settings "
        "on the model's entry, still loads, with a note per setting to move.",
    )
    engine_priority: bool = Field(
        default=False,
        description="The old form of the engine's scheduling: priority (true: fairq sends "
        "each request a priority).",
    )
    policy: Literal["round_robin", "token_fair"] = Field(
        default="round_robin",
        description="Who is next inside a band: round_robin (per request: a newcomer is "
        "served before anyone twice in a row) or token_fair (by tokens of service, each "
        "tenant by its weight; a returning user banks no credit).",
    )
    prompt_token_cost: float = Field(
        default=1.0,
        ge=0,
        description="token_fair: a job's service is its prompt tokens times this plus its "
        "output tokens times output_token_cost, estimated at dispatch, then corrected.",
    )
    output_token_cost: float = Field(
        default=2.0, ge=0, description="token_fair: the cost of one output token."
    )
    default_output_tokens: int = Field(
        default=256,
        ge=1,
        description="token_fair: the output estimate of a request without max_tokens.",
    )
    stream_from_engine: bool = Field(
        default=True,
        description="Ask the engine to stream the answers of requests whose clients want "
        "them whole, and rebuild each whole answer in the worker: fairq then sees their "
        "first token at once (admission, the newcomer's step and preemption rely on it). "
        "Requests with fields the rebuild does not cover (tools, log probabilities, echo, "
        "several choices, ...) go to the engine as sent.",
    )
    resume_streams: ResumeStreams = Field(
        default="exact",
        description="vLLM: preemption may also take a streamed answer back mid-way, to go "
        "on later. exact: only an answer whose token ids the engine returned, resumed token "
        "for token; text: also one without them, from its text (tokenised anew: its token "
        "count can be off by a few); off: never. true and false, the old values, read as "
        "text and off.",
    )

    allow_fields: tuple[str, ...] = Field(
        default=(),
        description="Request fields, beyond OpenAI's chat and completions fields, that "
        "this model's requests may carry to its engine, such as vLLM's top_k, min_p or "
        "ignore_eos (the simulator's sim_fault in fairq's tests); a request with any other "
        "field is refused with 400. Every client of the model may then ask the engine for "
        "it: leave out what a client should not steer, such as vLLM's chat_template, "
        "mm_processor_kwargs, logits_processors and kv_transfer_params.",
    )

    @field_validator("allow_fields")
    @classmethod
    def _field_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not name or name != name.strip():
                raise ValueError(f"{name!r} is not a field name: a request field, as in the body")
        return names

    @field_validator("resume_streams", mode="before")
    @classmethod
    def _resume_from_bool(cls, value: object) -> object:
        if isinstance(value, bool):
            return "text" if value else "off"
        return value

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _MODEL_NAME.match(name):
            raise ValueError(
                f"model name {name!r} must start with a letter or digit and use only "
                "letters, digits and . _ : / @ + - (at most 200 characters)"
            )
        return name

    @model_validator(mode="after")
    def _some_endpoints(self) -> ModelConfig:
        require_place("model", self.name, self)
        return self

    @property
    def admission_policy(self) -> str:
        return self.admission or ("static" if self.engine == "openai" else "metrics")
