"""``unseen.lua``: how many of a model's jobs an endpoint's metrics cannot show yet."""

from __future__ import annotations

from typing import Any, NamedTuple

from broker import keys
from broker.lua import Call, script

_SCRIPT = script("unseen")


class Unseen(NamedTuple):
    """Jobs an endpoint's metrics cannot show yet."""

    held: int  # on their way, or handed over and not streamed: may wait until a scrape
    streamed: int  # handed over, streamed, no first token yet: wait only until it
    # Every job sent to the endpoint without a first token yet (in transit, or in the engine
    # until its first token): what of the engine's queue fairq counts lag-free
    unstarted: int = 0
    # Handed over streamed within the start window, no first token yet: in the engine's
    # queue only until its next step takes them in (``dispatcher.capacity``)
    starting: int = 0
    # In flight to the endpoint, less those on their way and those handed over within the
    # lag: fairq's jobs the sample shows, running or waiting
    shown: int = 0


def unseen_call(model: str, endpoint: str, lag_ms: int, start_ms: int = 0) -> Call[Unseen]:
    """``lag_ms``: the engine's metrics lag; ``start_ms``: the start window (at most the
    second ``handed`` keeps; never shorter than the lag)."""
    model_keys = [
        keys.transit(model),
        keys.handed(model),
        keys.unstarted(model),
        keys.inflight(model),
    ]
    return Call(_SCRIPT, model_keys, [endpoint, lag_ms, keys.job_prefix(model), start_ms], _unseen)


def _unseen(reply: Any) -> Unseen:
    return Unseen(*(int(value) for value in reply))
