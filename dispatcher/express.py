"""The express grant: the dispatch a round would make for jobs not queued yet (I/O).

After each round the model's grant is refreshed from the same admission decision
(``admission.plan_grant``): new jobs that find nothing queued ahead of them then go
straight to an endpoint from enqueue.lua. Express is for bands more urgent than any
backlog: a job of a backlogged band (or a less urgent one) waits its turn anyway, so its
credits would go unused. A grant is written only when it changed or is half-way to its
expiry, and Redis refuses it if any send happened since the state it was computed from
(``broker.dispatching``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from broker import DispatchStore, Grant, ModelSnapshot
from dispatcher.admission import EndpointState, plan_grant
from dispatcher.stages import Stages


@dataclass(frozen=True)
class _Written:
    """The last express grant this process wrote for a model."""

    grant: Grant | None
    sequence: int
    at: float  # monotonic


class GrantWriter:
    """Writes each model's grant; one per dispatcher (``ttl_s`` 0: no grants)."""

    def __init__(self, store: DispatchStore, bands: Sequence[str], ttl_s: float) -> None:
        self._store = store
        self._bands = tuple(bands)
        self._ttl_s = ttl_s
        self._written: dict[str, _Written] = {}

    def forget(self, model: str) -> None:
        """The model's lease went elsewhere: what this process wrote says nothing now."""
        self._written.pop(model, None)

    async def refresh(
        self,
        model: str,
        snap: ModelSnapshot,
        states: Sequence[EndpointState],
        stages: Stages,
        allowed: bool,
    ) -> None:
        """Plan the grant from ``snap`` and ``states`` and write it if it changed (none
        unless ``allowed``: one grant names one endpoint, and an engine shared by several
        models takes sends only from its loop)."""
        if self._ttl_s <= 0:
            return
        bands = self._bands
        usable = bands if snap.empty else bands[: bands.index(snap.backlogs[0].band)]
        grant = None
        if usable and allowed:
            grant = plan_grant(stages.admission, states, usable, stages.config)
        now = time.monotonic()
        last = self._written.get(model)
        if last is not None and last.grant == grant:
            unchanged = last.sequence == snap.sequence and now - last.at < self._ttl_s / 2
            if grant is None or unchanged:
                return
        if await self._store.grant(model, grant, snap.sequence, int(self._ttl_s * 1000)):
            self._written[model] = _Written(grant, snap.sequence, now)
