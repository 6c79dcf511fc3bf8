"""A job's queue deadline: its band's, or a shorter one of its own (pure, no I/O).

A band may have a deadline (``queue_deadline_s``): a job still queued that long after it
was queued ends ``expired``. A request may ask for less, "an answer within 20 s or not at
all" (the gateway's ``X-Fairq-Max-Queue-S`` header, the Python client's ``max_queue_s=``).
Its own deadline is the shorter of the two: a request can shorten its wait, never lengthen
it past its band's, so a value at or above the band's deadline is clamped to it (nothing
is stored then: the band's deadline, enforced as before, is the job's). Both are enforced
by the same sweep (``workers.deadlines``, ``expire.lua``), at most ``deadline_sweep_s``
late, and only while the job waits for its first dispatch: one put back in the queue after
it was sent (``park.lua``, ``reroute.lua``: its user's parked list) is never expired.

A value is a number of seconds written in digits, with an optional fraction (``20``,
``2.5``), above 0 and at most ``MAX_QUEUE_S``; anything else (a sign, an exponent, NaN,
inf, a list) is a 400 whose message says what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from broker.errors import InvalidRequest

# The longest wait a request may ask for (what matters in a band without a deadline): past
# it a value is more likely a unit mistake (ms for s) than a wish.
MAX_QUEUE_S = 7 * 86_400
# Digits, with an optional fraction: ASCII only (float() takes other scripts' digits, "1_0",
# "1e3", "nan" and "inf").
SECONDS_PATTERN = r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+"
_SECONDS = re.compile(SECONDS_PATTERN)
_MAX_SHOWN = 40  # of a value the caller sent, in an error message


def max_queue_s(value: str | float, name: str) -> float:
    """The longest wait in the queue a request asks for, in seconds: ``value`` is a header's
    text or the Python client's number; InvalidRequest (400) naming ``name`` when it is not
    a number of seconds above 0 and at most ``MAX_QUEUE_S``."""
    if isinstance(value, str):
        text = value.strip()
        seconds = float(text) if _SECONDS.fullmatch(text) else math.nan
    else:
        seconds = float(value)
    if not 0 < seconds <= MAX_QUEUE_S:  # NaN is refused here too
        shown = str(value)
        shown = shown if len(shown) <= _MAX_SHOWN else shown[:_MAX_SHOWN] + "..."
        raise InvalidRequest(
            f"{name} must be a number of seconds above 0 and at most {MAX_QUEUE_S} (7 days), "
            f"such as 20 or 2.5, not {shown!r}: the longest the request may wait in the "
            "queue before it ends expired (408 job_expired)",
            code="invalid_max_queue_s",
        )
    return seconds


def own_deadline_ms(
    asked_s: float | None, band: str, band_deadlines: Mapping[str, float]
) -> int | None:
    """The job's own queue deadline in ms after it is queued, or None when it has none of
    its own: nothing asked, or no less than its band's deadline (``band_deadlines``, the
    ``queue_deadline_s`` setting), which then holds."""
    if asked_s is None:
        return None
    band_s = band_deadlines.get(band)
    if band_s is not None and asked_s >= band_s:
        return None
    return max(1, round(asked_s * 1000))
