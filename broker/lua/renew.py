"""``renew.lua``: renew a worker's lease on every ready entry it holds for one model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker import keys
from broker.lua import Call, script

_SCRIPT = script("renew")


def renew_call(model: str, worker: str, entries: Sequence[bytes]) -> Call[list[bytes]]:
    """Its reply: the entry ids the worker has lost (another worker owns them, or ended)."""
    return Call(_SCRIPT, [keys.ready(model)], [keys.READY_GROUP, worker, *entries], _lost)


def _lost(reply: Any) -> list[bytes]:
    return list(reply)
