"""The simulator's timing and capacity parameters, and loading them from YAML.

A profile is validated once at start-up and frozen; the engine reads it, never
writes it. The figures are estimates of an engine, not measurements.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workers.sim._errors import ProfileError

DEFAULT_PROFILE = "default"


class SimProfile(BaseModel):
    """How fast and how big the simulated engine is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_num_seqs: int = Field(default=32, ge=1)
    max_model_len: int = Field(default=4096, ge=2)
    step_base_ms: float = Field(default=6.0, ge=0.0)
    step_per_seq_ms: float = Field(default=0.15, ge=0.0)
    prefill_ms_per_token: float = Field(default=0.02, ge=0.0)
    default_output_tokens: int = Field(default=64, ge=1)


def load_profile(path_or_name: str | None = None) -> SimProfile:
    """Load the shipped profile (None or "default") or a profile YAML file."""
    if path_or_name is None or path_or_name == DEFAULT_PROFILE:
        source = f"{DEFAULT_PROFILE} (shipped)"
        text = _shipped_text(f"{DEFAULT_PROFILE}.yaml")
    else:
        source = path_or_name
        text = _file_text(Path(path_or_name))
    return _parse(text, source)


def _shipped_text(filename: str) -> str:
    return resources.files("workers.sim").joinpath("profiles", filename).read_text("utf-8")


def _file_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read profile {str(path)!r}: {exc.strerror}") from exc


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
