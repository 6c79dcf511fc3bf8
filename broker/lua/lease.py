"""``lease.lua``: take, keep or give back one model's dispatcher lease."""

from __future__ import annotations

from typing import Literal

from broker import keys
from broker.lua import Call, one, script

_SCRIPT = script("lease")

LeaseMode = Literal["acquire", "renew", "release"]


def lease_call(model: str, owner: str, lease_ms: int, mode: LeaseMode) -> Call[bool]:
    """``owner``: this dispatcher's id. Its reply: whether it owns the model afterwards."""
    return Call(_SCRIPT, [keys.owner(model)], [owner, lease_ms, mode], one)
