"""Each heavy user's share of output tokens while every heavy user is backlogged.

A heavy user is backlogged from its first token (it is being served) until the
first token of its last request (after that it has nothing waiting, in fairq or in
the engine). The window is where all heavy users are: from the latest of their
first tokens to the earliest end of a backlog. Tokens in the window come from the
streamed chunks' arrival times (counted per time bucket by the load client),
scaled to each answer's ``usage``; a bucket counts when its middle is inside.

Plain values in, plain values out: unit-testable on hand-made requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Streamed(Protocol):
    """What the shares read of one request (``benchmarks.lib.load.RequestResult``)."""

    @property
    def user(self) -> str: ...
    @property
    def first_token_s(self) -> float | None: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def buckets(self) -> dict[int, int]: ...


def backlog_window(
    requests: Sequence[Streamed], users: Sequence[str]
) -> tuple[float, float] | None:
    """[start, end] in seconds after t=0 while every user is backlogged (None: never)."""
    starts, ends = [], []
    for user in users:
        firsts = [r.first_token_s for r in requests if r.user == user]
        if not firsts or any(f is None for f in firsts):
            return None  # a request never started: its user's backlog cannot be placed
        known = [f for f in firsts if f is not None]
        starts.append(min(known))
        ends.append(max(known))
    start, end = max(starts), min(ends)
    return (start, end) if end > start else None


def tokens_in(request: Streamed, window: tuple[float, float], bucket_s: float) -> float:
    events = sum(request.buckets.values())
    if events == 0:
        return 0.0
    start, end = window
    inside = sum(n for b, n in request.buckets.items() if start <= (b + 0.5) * bucket_s <= end)
    return inside * request.output_tokens / events


def shares(
    requests: Sequence[Streamed], weights: Mapping[str, float], bucket_s: float
) -> dict[str, Any]:
    """Per heavy user: its weight's share, its share of the window's tokens, and how far
    off that is, relative to the weight's share (0.1: 10% off)."""
    heavy = [r for r in requests if r.user in weights]
    window = backlog_window(heavy, list(weights))
    if window is None:
        return {"window_s": None, "users": {}, "max_off": None}
    tokens = {u: sum(tokens_in(r, window, bucket_s) for r in heavy if r.user == u) for u in weights}
    total, total_weight = sum(tokens.values()), sum(weights.values())
    users = {}
    for user, weight in weights.items():
        weight_share = weight / total_weight
        share = tokens[user] / total if total > 0 else None
        off = None if share is None else abs(share - weight_share) / weight_share
        users[user] = {"weight": weight, "weight_share": weight_share, "tokens": tokens[user],
                       "share": share, "off": off}  # fmt: skip
    offs = [u["off"] for u in users.values() if u["off"] is not None]
    return {"window_s": list(window), "users": users, "max_off": max(offs) if offs else None}
