"""The simulator's token ids: enough of a tokenizer for answers to go on from token ids.

The simulator has no tokenizer. Its answer is a walk through a word list whose start
depends on the prompt's first token id (the anchor) and on where the answer starts (the
prompt's length), so an answer is a function of its absolute token positions: a prompt
made of another prompt's ids plus the first k ids of its answer gets the rest of that
answer, token for token, as a real engine's greedy decoding would. That is what fairq's
exact resume relies on (``workers.resume_exact``).

A text prompt's ids are made up: its anchor comes from the request id (so "same id,
same text" holds, as before), then filler ids up to its length in tokens. A prompt given
as ids is taken as it is. A word's id is its place in the word list, past ``WORD_BASE``.
"""

from __future__ import annotations

import zlib

VOCAB = 32_000  # anchors and filler ids stay below it, as a real vocabulary's would
WORD_BASE = 100  # word i has id WORD_BASE + i
STRIDE = 7919  # a prime, so successive tokens walk the whole word list


def anchor_of(response_id: str) -> int:
    return zlib.crc32(response_id.encode()) % VOCAB


def prompt_ids(anchor: int, length: int) -> list[int]:
    """A text prompt's made-up ids: the anchor, then filler."""
    return [anchor] + [(anchor + k * STRIDE) % VOCAB for k in range(1, length)]


def answer_seed(anchor: int, prompt_len: int) -> int:
    """Where the word walk of an answer after ``prompt_len`` prompt tokens starts."""
    return anchor + prompt_len * STRIDE


def word_index(seed: int, index: int, words: int) -> int:
    """The word of the answer's ``index``-th token."""
    return (seed + index * STRIDE) % words
