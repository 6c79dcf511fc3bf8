"""The cyclic garbage collector of a long-running fairq process, tuned once it has started.

CPython's default runs a young collection every 700 net allocations. A gateway
streaming to 1,000 clients allocates far faster than that, and each stream's objects
live as long as its request, so they were scanned and promoted again and again, and
full collections walked every live stream, stalling the event loop for tens to
hundreds of milliseconds (every token and every new request waited behind them; the
fan-out benchmark in ``docs/performance.md`` measures the difference). Two changes:

* what start-up made (modules, the app, settings) is frozen (``gc.freeze``): never
  scanned again;
* a young collection runs every ``gc_young_threshold`` net allocations; the older
  generations keep CPython's ratios, so cyclic garbage is still freed, less often.

Objects freed by reference counting, nearly all of them, are freed at once as before.
"""

from __future__ import annotations

import gc

from broker.settings import Settings

# CPython's ratios for the middle and old generations: a full collection every 100
# young ones at most (it also waits until a quarter of the old generation is new).
_MIDDLE, _OLD = 10, 10


def settle(settings: Settings) -> None:
    """Freeze what start-up made and collect the young generation less often; a
    ``gc_young_threshold`` of 0 keeps CPython's defaults."""
    if settings.gc_young_threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(settings.gc_young_threshold, _MIDDLE, _OLD)
