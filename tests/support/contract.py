"""What the broker contract's tests share: one model (in-flight cap 4) and a submission."""

from __future__ import annotations

from typing import Any

from broker import RequestKind, Settings, StreamMode, Submission
from tests.support.settings import ENDPOINT as EP
from tests.support.settings import MODEL, make_settings

__all__ = ["EP", "MODEL", "settings", "submission"]


def settings(model_fields: dict[str, Any] | None = None, **overrides: Any) -> Settings:
    """The shared builder's settings, the model capped at 4 jobs in flight."""
    fields = {"inflight_cap": 4, **(model_fields or {})}
    return make_settings("redis://unused", model_fields=fields, **overrides)


def submission(user: str, band: str = "default", owner: str | None = None) -> Submission:
    return Submission(
        model=MODEL,
        owner=owner or user,
        user=user,
        tenant=user,
        band=band,
        kind=RequestKind.CHAT,
        stream_flag=StreamMode.STREAMED,
        payload=b'{"model":"m1"}',
    )
