"""``forget.lua``: remove the ready group's consumers that hold nothing and have not read for
long (workers that stopped or died)."""

from __future__ import annotations

from typing import Any

from broker import keys
from broker.lua import Call, script

_SCRIPT = script("forget")


def forget_call(model: str, idle_ms: int) -> Call[list[str]]:
    """Its reply: the names removed."""
    return Call(_SCRIPT, [keys.ready(model)], [keys.READY_GROUP, idle_ms], _names)


def _names(reply: Any) -> list[str]:
    return [name.decode() for name in reply]
