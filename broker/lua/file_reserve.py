"""``file_reserve.lua``: count a file against its owner's quota, or refuse it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from broker import keys
from broker.lua import Call, script

_SCRIPT = script("file_reserve")


class Outcome(enum.Enum):
    COUNTED = 0
    TOO_MANY_FILES = 1
    TOO_MANY_BYTES = 2


@dataclass(frozen=True, slots=True)
class Reservation:
    outcome: Outcome
    files: int  # what the owner held before the call
    bytes: int


def _reservation(reply: Any) -> Reservation:
    outcome, files, held = reply
    return Reservation(Outcome(int(outcome)), int(files), int(held))


def file_reserve_call(
    owner: str, file_id: str, size: int, *, ends_at_s: int, max_bytes: int, max_files: int
) -> Call[Reservation]:
    """``ends_at_s``: when the file stops counting (unix s); ``max_bytes``/``max_files``:
    the owner's limits, 0 for none (the file is counted and never refused)."""
    held, ends = keys.owner_files_held(owner), keys.owner_files_ends(owner)
    owner_keys = [held, ends, keys.owner_files(owner)]
    return Call(_SCRIPT, owner_keys, [file_id, size, ends_at_s, max_bytes, max_files], _reservation)
