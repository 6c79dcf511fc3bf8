"""``grant.lua``: set (or revoke) a model's express grant."""

from __future__ import annotations

from collections.abc import Sequence

from broker import keys
from broker.lua import Call, one, script

_SCRIPT = script("grant")


def grant_call(
    model: str,
    *,
    sequence: int,
    ttl_ms: int,
    endpoint: str,
    served: int,
    credits: Sequence[tuple[str, int]],
) -> Call[bool]:
    """``sequence``: the express sequence ('xs') of the state the grant was computed from;
    ``endpoint``: '' revokes; ``served``: sends left to users who already have a job in the
    engine (-1: no bound); ``credits``: (band, new jobs it may send) for every band. Its
    reply: whether the grant was written (refused: computed from an older state)."""
    fields = [v for band, n in credits for v in (keys.grant_field(band), n)]
    return Call(_SCRIPT, [keys.meta(model)], [sequence, ttl_ms, endpoint, served, *fields], one)
