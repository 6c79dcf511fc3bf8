"""``file_release.lua``: a file stops counting against its owner's quota."""

from __future__ import annotations

from broker import keys
from broker.lua import Call, script

_SCRIPT = script("file_release")


def file_release_call(owner: str, file_id: str) -> Call[int]:
    """Its reply: the bytes released (0: the file was not counted)."""
    owner_keys = [keys.owner_files_held(owner), keys.owner_files_ends(owner)]
    return Call(_SCRIPT, owner_keys, [file_id], int)
