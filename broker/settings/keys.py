"""The API keys: who a request is counted for, and what the key may use."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from broker.settings._base import Frozen

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ApiKeyConfig(Frozen):
    """An API key, stored as the SHA-256 of the key (``fairq hash-key``)."""

    sha256: str = Field(
        description="The key's SHA-256, 64 lowercase hex digits: `fairq hash-key KEY` "
        "prints it (the key itself is never stored)."
    )
    user: str = Field(
        min_length=1,
        max_length=200,
        description="The fairness unit: the user whose share the key's requests take.",
    )
    tenant: str | None = Field(
        default=None, description="The user's tenant; null: the user is its own tenant."
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        description="token_fair: the tenant's share (2: twice the service); the users of "
        "one tenant split its share equally.",
    )
    bands: tuple[str, ...] | None = Field(
        default=None,
        description="The bands the key may use, its default first; null: every band.",
    )
    models: tuple[str, ...] | None = Field(
        default=None, description="The models the key may use; null: every model."
    )
    admin: bool = Field(default=False, description="May read /v1/admin and the dashboard.")
    trusted_app: bool = Field(
        default=False,
        description="May name its end users with OpenAI's user field: one app serving many "
        "people then shares fairly among them.",
    )

    @field_validator("sha256")
    @classmethod
    def _valid_hash(cls, value: str) -> str:
        if not _SHA256.match(value):
            raise ValueError("sha256 must be 64 lowercase hex digits (see `fairq hash-key`)")
        return value
