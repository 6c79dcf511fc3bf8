"""Reading a stored file line by line from a byte offset, one block at a time.

A line longer than the limit is reported as ``None`` and skipped to its end
without being held, so a file without newlines (not JSONL at all) costs one
block of memory, not its size.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from broker.batch.files import FileStore


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based line number in the file
    end: int  # byte offset just after the line (and its newline)
    raw: bytes | None  # None: longer than the limit


async def read_lines(
    files: FileStore, file_id: str, offset: int, number: int, max_line: int
) -> AsyncIterator[Line]:
    """The non-blank lines after byte ``offset`` (which ends line ``number``)."""
    carry = bytearray()
    too_long = False
    base = offset  # file offset of the block's first byte
    async for block in files.blocks(file_id, offset):
        start = 0
        while (newline := block.find(b"\n", start)) >= 0:
            number += 1
            if not too_long:
                carry += block[start:newline]
            line = _line(number, base + newline + 1, carry, too_long or len(carry) > max_line)
            if line is not None:
                yield line
            carry.clear()
            too_long, start = False, newline + 1
        if not too_long:
            carry += block[start:]
            if len(carry) > max_line:
                carry.clear()
                too_long = True
        base += len(block)
    last = _line(number + 1, base, carry, too_long)
    if last is not None:
        yield last


def _line(number: int, end: int, carry: bytearray, too_long: bool) -> Line | None:
    if too_long:
        return Line(number, end, None)
    return Line(number, end, bytes(carry)) if carry.strip() else None
