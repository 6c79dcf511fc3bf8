"""OpenAI's rate-limit headers, from a request's quotas (``broker.quotas``).

Every answer of the completions routes to a key with a quota says, per unit its quotas
limit (tokens, requests), the tightest limit: the one with the least left after this
request (of two alike, the one that frees later), as OpenAI's do::

    x-ratelimit-limit-tokens: 20000        the limit
    x-ratelimit-remaining-tokens: 19832    what is left of it in its window, this request's
                                           estimate taken
    x-ratelimit-reset-tokens: 41.5s        until its window ends and counts 0 again

A 429 adds ``Retry-After`` (whole seconds, rounded up) and ``retry-after-ms`` (the openai
clients read it first) until every limit it would pass has reset; they then retry once
that is at most 2 minutes away (a day's limit usually is not). A request that passes a
limit alone gets ``x-should-retry: false``: no wait would let it pass.
"""

from __future__ import annotations

import math

from broker.errors import OverQuota
from broker.quotas import Reading, Unit


def ratelimit_headers(quota: Reading) -> dict[str, str]:
    """The ``x-ratelimit-*`` headers of a request's quotas."""
    headers = {}
    for unit in Unit:
        standing = quota.standing(unit)
        if standing is not None:
            name = unit.value
            headers[f"x-ratelimit-limit-{name}"] = str(standing.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(standing.remaining)
            headers[f"x-ratelimit-reset-{name}"] = duration(standing.reset_ms)
    return headers


def refusal_headers(exc: OverQuota) -> dict[str, str]:
    """A 429's: the quotas' headers and when to try again (``error_response`` adds
    ``x-should-retry: false`` to a final one)."""
    return {
        **ratelimit_headers(exc.quota),
        "Retry-After": str(max(1, math.ceil(exc.retry_after_ms / 1000))),
        "retry-after-ms": str(exc.retry_after_ms),
    }


def duration(ms: int) -> str:
    """A time as OpenAI's reset headers write it (Go's): ``20ms``, ``1.5s``, ``6m0s``,
    ``2h3m4.25s``."""
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"
