"""Quotas: what one tenant, or one key's user, may use in a UTC minute and a UTC day
(``broker.quotas`` counts them in Redis, in the call that queues the job)."""

from __future__ import annotations

from pydantic import Field, model_validator

from broker.errors import SettingError
from broker.settings._base import Frozen

LIMITS = ("tokens_per_minute", "tokens_per_day", "requests_per_minute", "requests_per_day")


class QuotaConfig(Frozen):
    """The limits of one tenant or one user; a request must fit in every limit of its
    tenant's entry and of its user's."""

    tenant: str | None = Field(
        default=None,
        min_length=1,
        description="The tenant (of api_keys) the limits are for, shared by all its keys "
        "and users; or name a user.",
    )
    user: str | None = Field(
        default=None,
        min_length=1,
        description="The user (of api_keys) the limits are for, whichever of its keys it "
        "sends with; or name a tenant.",
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Prompt and output tokens of the jobs queued in one UTC minute; null: "
        "no limit. A job is charged its estimate when queued (its prompt at ~4 characters a "
        "token, plus max_tokens) and corrected to its usage at its end; a request that "
        "does not fit gets 429 rate_limit_exceeded with Retry-After.",
    )
    tokens_per_day: int | None = Field(
        default=None,
        ge=1,
        description="Likewise in one UTC day; batch lines count here as they end (never refused).",
    )
    requests_per_minute: int | None = Field(
        default=None, ge=1, description="Jobs queued in one UTC minute; null: no limit."
    )
    requests_per_day: int | None = Field(
        default=None, ge=1, description="Jobs queued in one UTC day; null: no limit."
    )

    @model_validator(mode="after")
    def _names_one_scope_and_a_limit(self) -> QuotaConfig:
        if (self.tenant is None) == (self.user is None):
            raise SettingError(("tenant",), "name either a tenant or a user, not both")
        if all(getattr(self, name) is None for name in LIMITS):
            raise SettingError(
                ("tokens_per_minute",), f"give the {self.scope} at least one of {', '.join(LIMITS)}"
            )
        return self

    @property
    def scope(self) -> str:
        """Who the limits are for, as a person reads it: ``tenant 'research'``."""
        return f"tenant {self.tenant!r}" if self.tenant is not None else f"user {self.user!r}"
