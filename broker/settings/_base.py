"""What every settings class of fairq shares: frozen, and no key it does not know."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """A section of the settings: immutable once validated; an unknown key is an error
    (a typo must not pass for a default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
