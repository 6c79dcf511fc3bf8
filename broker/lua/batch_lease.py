"""``batch_lease.lua``: renew or release the lease on a batch, only by the step holding it."""

from __future__ import annotations

from broker import keys
from broker.lua import Call, one, script

_SCRIPT = script("batch_lease")


def batch_lease_call(batch_id: str, token: str, lease_ms: int) -> Call[bool]:
    """``token``: the holder's; ``lease_ms``: the new lease, 0 releases it. Its reply:
    whether the caller holds (held) the lease."""
    return Call(_SCRIPT, [keys.batch_lease(batch_id)], [token, lease_ms], one)
