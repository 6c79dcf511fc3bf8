"""``batch_record.lua``: record how one line of a batch ended, exactly once, and count it."""

from __future__ import annotations

from typing import Literal

from broker import keys
from broker.lua import Call, one, script

_SCRIPT = script("batch_record")


def batch_record_call(
    batch_id: str,
    line: int,
    counter: Literal["completed", "failed"],
    record: bytes,
    member: bytes | str,
) -> Call[bool]:
    """``member``: the line's pending member, or '' (a line that was never queued). Its
    reply: whether this call recorded the line (not: it was recorded before)."""
    b = batch_id
    batch_keys = [keys.batch(b), keys.batch_results(b), keys.batch_pending(b)]
    return Call(_SCRIPT, batch_keys, [line, counter, record, member], one)
