"""The simulator's timing and capacity parameters, and loading them from YAML.

A profile is validated once at start-up and frozen; the engine reads it, never
writes it. The figures are estimates of an engine, not measurements. Profiles
ship in `profiles/` (`default`, `h100-8b`) and are loaded by name; any other
argument is a path to a YAML file with the same keys.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim._errors import ProfileError
from sim._faults import Fault

DEFAULT_PROFILE = "default"
_SHIPPED_SUFFIX = ".yaml"


class SimProfile(BaseModel):
    """How fast and how big the simulated engine is (the defaults are `default.yaml`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_seqs: int = Field(default=32, ge=1)
    max_model_len: int = Field(default=4096, ge=2)
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    step_base_ms: float = Field(default=6.0, ge=0.0)
    step_per_seq_ms: float = Field(default=0.15, ge=0.0)
    prefill_ms_per_token: float = Field(default=0.02, ge=0.0)
    kv_cache_tokens: int = Field(default=131072, ge=1)
    block_size: int = Field(default=16, ge=1)
    # vLLM's automatic prefix caching (on by default in V1): a prompt's leading blocks that
    # an earlier prompt computed skip their prefill (_prefix). The cache's size in tokens;
    # None: the whole KV cache (an engine whose batch leaves most of it free).
    enable_prefix_caching: bool = True
    prefix_cache_tokens: int | None = Field(default=None, ge=0)
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    default_output_tokens: int = Field(default=64, ge=1)
    fault: Fault | None = None  # injected into every request that asks for none (_faults)
    # False: the engine ignores vLLM's return_token_ids, as releases before it did.
    return_token_ids: bool = True
    # As vLLM started with VLLM_SERVER_DEV_MODE=1: GET /server_info says the engine's
    # configuration (here what the simulator has: its scheduling policy and sizes). vLLM
    # says its scheduling policy nowhere else.
    dev_mode: bool = False
    # The models serve /v1/embeddings (as a vLLM pod of a pooling model does); False: the
    # route is not there (404, as a pod of a generative model answers).
    embeddings: bool = True

    @property
    def num_kv_blocks(self) -> int:
        return self.kv_cache_tokens // self.block_size

    @property
    def prefix_cache_blocks(self) -> int:
        if not self.enable_prefix_caching:
            return 0
        tokens = self.prefix_cache_tokens
        if tokens is None:
            tokens = self.kv_cache_tokens
        return tokens // self.block_size

    @model_validator(mode="after")
    def _engine_can_start(self) -> Self:
        # vLLM refuses to start with these, so a profile must not describe such an engine.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        # One sequence of max_model_len tokens must fit alone, or it could never finish.
        if self.num_kv_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}, in blocks of {self.block_size}) "
                f"cannot hold one sequence of max_model_len ({self.max_model_len}) tokens"
            )
        return self


def load_profile(path_or_name: str | None = None) -> SimProfile:
    """Load a shipped profile by name (None means "default") or a profile YAML file."""
    name = DEFAULT_PROFILE if path_or_name is None else path_or_name
    if name in shipped_profiles():
        return _parse(_shipped_text(name + _SHIPPED_SUFFIX), f"{name} (shipped)")
    return _parse(_file_text(Path(name)), name)


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with the simulator."""
    folder = resources.files("sim").joinpath("profiles")
    return sorted(
        entry.name.removesuffix(_SHIPPED_SUFFIX)
        for entry in folder.iterdir()
        if entry.name.endswith(_SHIPPED_SUFFIX)
    )


def _shipped_text(filename: str) -> str:
    return resources.files("sim").joinpath("profiles", filename).read_text("utf-8")


def _file_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        shipped = ", ".join(shipped_profiles())
        raise ProfileError(
            f"cannot read profile {str(path)!r}: {exc.strerror} "
            f"(shipped profiles by name: {shipped})"
        ) from exc


def _parse(text: str, source: str) -> SimProfile:
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"profile {source}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(
            f"profile {source}: expected a mapping of keys, got {type(data).__name__}"
        )
    unknown = sorted(str(key) for key in data if key not in SimProfile.model_fields)
    if unknown:
        known = ", ".join(SimProfile.model_fields)
        raise ProfileError(f"profile {source}: unknown key(s) {unknown}; known keys: {known}")
    try:
        return SimProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"profile {source}: {exc}") from exc
