"""The scaler's latest demand per model, and the KEDA streams that wait on its changes.

``DemandWatch`` (``scaler.watch``) writes each read into the board; every
``StreamIsActive`` call holds a ``Listener`` on its model. A listener keeps only the
model's latest activity and a flag that it changed: a stream sends what is true when it
gets to send, so a slow stream never queues a backlog, and a demand that came and went
between two sends (a job that ended before KEDA was told) is not reported, as there is
nothing left to wake for.

The board knows when it was last read: past ``stale_after_s`` its answers are refused
(``Stale``), so that KEDA keeps the replicas it has instead of scaling on a demand
nobody could read (Redis down).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field


class Stale(RuntimeError):
    """The demand was not read recently enough to answer."""


@dataclass(eq=False)  # each listener is itself (kept in a set)
class Listener:
    model: str
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class DemandBoard:
    def __init__(self, models: Iterable[str], stale_after_s: float) -> None:
        self._demand: dict[str, int | None] = dict.fromkeys(models)
        self._listeners: dict[str, set[Listener]] = {m: set() for m in self._demand}
        self._stale_after_s = stale_after_s
        self._read_at: float | None = None  # monotonic time of the last full read
        self.closed = asyncio.Event()  # the server stops: every stream ends

    @property
    def models(self) -> list[str]:
        return list(self._demand)

    def update(self, demand: dict[str, int], *, complete: bool) -> list[str]:
        """Record a read (``complete``: of every model, so the board is fresh); return the
        models whose activity changed, each of whose listeners is told. A complete read
        after a stale spell tells every listener: a stream that could not send then sends
        now, changed or not."""
        now_s = time.monotonic()
        was_stale = self._stale(now_s)
        if complete:
            self._read_at = now_s
        flipped = []
        for model, now in demand.items():
            before = self._demand.get(model)
            self._demand[model] = now
            if before is None or (before > 0) != (now > 0):
                flipped.append(model)
            if model in flipped or (complete and was_stale):
                for listener in self._listeners[model]:
                    listener.changed.set()
        return flipped

    def _stale(self, now_s: float) -> bool:
        return self._read_at is None or now_s - self._read_at > self._stale_after_s

    def demand(self, model: str) -> int:
        """The model's latest demand; ``Stale`` if the board is too old to trust."""
        value = self._demand.get(model)
        if value is None or self._stale(time.monotonic()):
            raise Stale(
                f"the demand of model {model!r} was not read from Redis in the last "
                f"{self._stale_after_s:g} s: is Redis reachable from the scaler?"
            )
        return value

    def listen(self, model: str) -> Listener:
        listener = Listener(model)
        listener.changed.set()  # a stream sends the current state first
        self._listeners[model].add(listener)
        return listener

    def forget(self, listener: Listener) -> None:
        self._listeners[listener.model].discard(listener)

    def streams(self) -> int:
        return sum(len(listeners) for listeners in self._listeners.values())
