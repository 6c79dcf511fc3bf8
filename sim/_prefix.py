"""The simulated engine's prefix cache: vLLM's automatic prefix caching, reduced to hashes.

vLLM (V1, prefix caching on by default) hashes a prompt in full blocks of
``block_size`` tokens, each block's hash chained to the one before it, so a block
can only hit if every block before it hits too. A new request skips the prefill of
its longest run of cached leading blocks, less at least one token: the engine must
compute the last prompt token to get the logits of the first output token.

Here each engine holds an LRU set of block hashes with a capacity in tokens. vLLM
keeps cached blocks inside its KV pool and evicts the least recently freed ones as
the pool needs room; a separate LRU of a fixed size is the same thing for an engine
whose running batch leaves that much of the pool free. Only prompt blocks are cached
(vLLM also caches full blocks of output, which the next turn of a chat carries as text
in its prompt; the simulator has no tokenizer to match the two).

The prompt's blocks come from ``block_hashes``: token ids in blocks of ``block_size``,
or a text in blocks of ``block_size`` x ``CHARS_PER_TOKEN`` characters (the simulator's
token estimate), so two prompts that share a leading text share their leading blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

CHARS_PER_TOKEN = 4  # as _parsing: a rough English average


def block_hashes(prompt: str | Sequence[int], block_size: int, max_blocks: int) -> tuple[int, ...]:
    """The chained hashes of the prompt's full blocks, at most ``max_blocks`` of them."""
    width = block_size * CHARS_PER_TOKEN if isinstance(prompt, str) else block_size
    count = min(len(prompt) // width, max_blocks)
    hashes: list[int] = []
    parent = 0
    for index in range(count):
        chunk = prompt[index * width : (index + 1) * width]
        parent = hash((parent, chunk if isinstance(chunk, str) else tuple(chunk)))
        hashes.append(parent)
    return tuple(hashes)


class PrefixCache:
    """An LRU set of block hashes; ``capacity_blocks`` 0 caches nothing."""

    def __init__(self, capacity_blocks: int) -> None:
        self._capacity = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def hits(self, blocks: Sequence[int], limit: int) -> int:
        """How many of the first ``limit`` blocks are cached in a row from the start."""
        count = 0
        for block in blocks[:limit]:
            if block not in self._blocks:
                break
            count += 1
        return count

    def touch(self, blocks: Sequence[int]) -> None:
        """Cache ``blocks`` (or refresh them) as the most recently used, in order, so the
        prompt's last block is evicted first: it is the least likely to be shared."""
        if self._capacity == 0:
            return
        for block in reversed(blocks):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
