"""``batch_status.lua``: move a batch to a new status if it is in one of the allowed ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from broker import keys
from broker.lua import Call, script
from broker.redis.resp import Arg

_SCRIPT = script("batch_status")


class Move(NamedTuple):
    moved: bool
    status: str  # the status before (moved) or now (not moved; '' if there is no batch)


def batch_status_call(
    batch_id: str, to: str, allowed: Sequence[str], stamp: str, fields: Mapping[str, Arg]
) -> Call[Move]:
    """``stamp``: a field to stamp with the time in seconds, or ''; ``fields``: more fields
    to set with the move."""
    more = [v for name, value in fields.items() for v in (name, value)]
    args = [to, "," + ",".join(allowed) + ",", stamp, *more]
    return Call(_SCRIPT, [keys.batch(batch_id)], args, _move)


def _move(reply: Any) -> Move:
    moved, status = reply
    return Move(bool(moved), status.decode() if isinstance(status, bytes) else str(status))
