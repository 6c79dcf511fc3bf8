"""What the broker contract's tests share: one model, its settings and a submission."""

from __future__ import annotations

from broker import RequestKind, Settings, Submission

MODEL = "m1"
EP = "http://127.0.0.1:9"


def settings(**overrides: object) -> Settings:
    base: dict[str, object] = {
        "redis_url": "redis://unused",
        "models": [{"name": MODEL, "endpoints": [EP], "inflight_cap": 4}],
    }
    return Settings(**(base | overrides))  # type: ignore[arg-type]


def submission(user: str, band: str = "default", owner: str | None = None) -> Submission:
    return Submission(
        model=MODEL, owner=owner or user, user=user, tenant=user, band=band,
        kind=RequestKind.CHAT, stream_flag="1", payload=b'{"model":"m1"}',
    )  # fmt: skip
