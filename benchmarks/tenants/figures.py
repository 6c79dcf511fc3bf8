"""The tenants harness's figures, from what the load recorded (pure, no I/O).

- ``latencies``: p50/p95/p99 of a class's TTFTs or inter-token gaps, with the count.
- ``token_gaps``: a stream's inter-token latencies from when its events arrived.
- ``windowed_shares``: each tenant's share of the output tokens in fixed windows, while
  every tenant is backlogged, against the share its weight asks for.
- ``jain``: Jain's fairness index of weight-normalised shares (1: exactly the weights).
- ``arm_status``: an arm with any failed request fails, naming the first error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchmarks.lib.stats import pct

PERCENTILES = (50, 95, 99)


@dataclass(frozen=True)
class Latencies:
    """Percentiles in ms of ``count`` values (None: no values)."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None

    def as_dict(self) -> dict[str, float | int | None]:
        return {"count": self.count, "p50": self.p50, "p95": self.p95, "p99": self.p99}


def latencies(values_s: Sequence[float]) -> Latencies:
    """p50/p95/p99 in ms of values in seconds (linear interpolation between ranks)."""
    if not values_s:
        return Latencies(0, None, None, None)
    p50, p95, p99 = (pct(values_s, p) * 1000 for p in PERCENTILES)
    return Latencies(len(values_s), p50, p95, p99)


def token_gaps(reads: Sequence[tuple[float, int]], tokens: int) -> list[float]:
    """Inter-token latencies (s) of a stream of ``tokens`` tokens from its reads, each
    (when, events in it), from the one with the first token on. Events that came in one
    read are 0 apart, as the client sees them. The stream's last events carry no token
    (the finish reason, the usage): only the first ``tokens`` count."""
    gaps: list[float] = []
    last: float | None = None
    for at, events in reads:
        if events <= 0:
            continue
        if last is not None:
            gaps.append(at - last)
        gaps.extend([0.0] * (events - 1))
        last = at
    return gaps[: max(0, tokens - 1)]


@dataclass(frozen=True)
class Window:
    """One window of the backlogged span: each tenant's output tokens in it."""

    start_s: float
    tokens: Mapping[str, float]

    def shares(self) -> dict[str, float]:
        total = sum(self.tokens.values())
        return {t: (n / total if total else 0.0) for t, n in self.tokens.items()}


def windowed_shares(
    events: Sequence[tuple[float, str, float]],
    tenants: Sequence[str],
    span: tuple[float, float],
    window_s: float,
) -> list[Window]:
    """The whole windows of ``span`` (start, end in s), each with every tenant's output
    tokens from ``events`` (when, tenant, tokens). A trailing part window is left out: its
    few tokens would swing the shares."""
    start, end = span
    count = int((end - start) // window_s)
    windows = [{t: 0.0 for t in tenants} for _ in range(count)]
    for at, tenant, tokens in events:
        index = int((at - start) // window_s)
        if 0 <= index < count and tenant in windows[index]:
            windows[index][tenant] += tokens
    return [Window(start + i * window_s, w) for i, w in enumerate(windows)]


def wanted_shares(weights: Mapping[str, float]) -> dict[str, float]:
    """The share of the tokens each tenant's weight asks for."""
    total = sum(weights.values())
    return {t: w / total for t, w in weights.items()}


def share_errors(shares: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """Each tenant's realised share against its wanted one, relative: 0.05 is 5% over."""
    wanted = wanted_shares(weights)
    return {t: shares.get(t, 0.0) / wanted[t] - 1 for t in wanted}


def jain(shares: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Jain's index of the shares divided by the weights: (sum x)^2 / (n sum x^2), 1 when
    every tenant got exactly its weight's share, 1/n when one got everything."""
    normalised = [shares.get(t, 0.0) / w for t, w in weights.items()]
    squares = sum(x * x for x in normalised)
    if not squares:
        return 0.0
    return sum(normalised) ** 2 / (len(normalised) * squares)


def arm_status(errors: Sequence[str | None]) -> dict[str, object]:
    """``ok``, or ``FAILED`` with how many of the arm's requests failed and the first
    error: an arm with failed requests never reports as passing."""
    failed = [e for e in errors if e is not None]
    if not failed:
        return {"status": "ok", "failed": 0, "first_error": None}
    return {"status": "FAILED", "failed": len(failed), "first_error": failed[0]}
