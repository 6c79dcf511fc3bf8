"""Which models this dispatcher replica runs: a fair share of them, held by leases.

Any number of dispatcher replicas may run. Each round (a third of the lease),
a replica renews its heartbeat and the leases it holds, gives back models above
its share (``ceil(models / live replicas)``), and tries to take free models up
to its share. Replicas prefer different models (rendezvous order on a hash of
their id and the model), so they rarely race for the same one. A replica that
dies stops renewing: its models are free when their leases lapse and are taken
in the next round of the others, within ``lease + lease / 3``.

``plan`` is the pure part; ``Ownership`` runs it against ``broker.OwnershipStore``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from redis.exceptions import RedisError

from broker import OwnershipStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeasePlan:
    release: list[str]  # owned above the share
    acquire: list[str]  # models not owned, in this replica's preferred order
    wanted: int  # how many of ``acquire`` to take (the others may hold some of them)


def preference(me: str, model: str) -> bytes:
    """Rendezvous hashing: every replica ranks the models in its own stable order."""
    return hashlib.blake2b(f"{me}\n{model}".encode(), digest_size=8).digest()


def plan(models: Sequence[str], owned: set[str], alive: int, me: str) -> LeasePlan:
    """What to give back and what to try to take, for a fair share of ``models``."""
    share = math.ceil(len(models) / max(alive, 1))
    ranked = sorted(models, key=lambda m: preference(me, m))
    mine = [m for m in ranked if m in owned]
    if len(mine) > share:
        return LeasePlan(release=mine[share:], acquire=[], wanted=0)
    free = [m for m in ranked if m not in owned]
    return LeasePlan(release=[], acquire=free, wanted=share - len(mine))


class Ownership:
    """Holds this replica's leases; ``on_change(owned)`` hears every change of the set."""

    def __init__(
        self,
        store: OwnershipStore,
        models: Sequence[str],
        me: str,
        lease_ms: int,
        on_change: Callable[[frozenset[str]], None],
    ) -> None:
        self._store = store
        self._models = list(models)
        self._me = me
        self._lease_ms = lease_ms
        self._on_change = on_change
        self.owned: frozenset[str] = frozenset()

    async def run(self) -> None:
        """Renew and rebalance every third of the lease until cancelled; then leave."""
        try:
            while True:
                try:
                    await self.round()
                except RedisError as exc:
                    # Keep dispatching: a lease that lapses meanwhile is noticed at the
                    # next renewal, and a second owner for a moment is harmless.
                    log.warning("dispatcher leases could not be renewed (%s)", exc)
                await asyncio.sleep(self._lease_ms / 3000)
        finally:
            self._set(frozenset())
            await asyncio.shield(self._leave())

    async def round(self) -> frozenset[str]:
        """One renewal and rebalancing round; returns the models owned after it."""
        alive = await self._store.heartbeat(self._me, self._lease_ms)
        owned = await self._store.lease(self.owned, self._me, self._lease_ms, "renew")
        if lost := self.owned - owned:
            await self._report_lost(lost)
        todo = plan(self._models, owned, alive, self._me)
        if todo.release:
            await self._store.lease(todo.release, self._me, self._lease_ms, "release")
            owned -= set(todo.release)
        owned |= await self._acquire(todo.acquire, todo.wanted)
        self._set(frozenset(owned))
        return self.owned

    async def _report_lost(self, lost: Iterable[str]) -> None:
        """Say why a renewal failed: a lease nobody holds lapsed (Redis lost it in a
        restart, or this replica did not renew it in time); one another replica holds was
        taken over after it lapsed."""
        holders = await self._store.owners(sorted(lost))
        if lapsed := [model for model, holder in holders.items() if holder is None]:
            log.warning(
                "the lease of models %s lapsed before this dispatcher renewed it (Redis "
                "restarted without it, or Redis or this process stalled for over %d ms); "
                "nobody holds them: taking them again",
                lapsed,
                self._lease_ms,
            )
        for other in sorted({h for h in holders.values() if h is not None}):
            models = [model for model, holder in holders.items() if holder == other]
            log.warning(
                "dispatcher %s took over models %s: this dispatcher had not renewed their "
                "lease within %d ms",
                other,
                models,
                self._lease_ms,
            )

    async def _acquire(self, candidates: list[str], wanted: int) -> set[str]:
        """Take up to ``wanted`` of the candidates, in order, skipping those held by others
        (tried in batches of what is still missing, so never more than ``wanted``)."""
        taken: set[str] = set()
        while candidates and len(taken) < wanted:
            batch, candidates = candidates[: wanted - len(taken)], candidates[wanted - len(taken) :]
            taken |= await self._store.lease(batch, self._me, self._lease_ms, "acquire")
        return taken

    def _set(self, owned: frozenset[str]) -> None:
        if owned != self.owned:
            self.owned = owned
            self._on_change(owned)

    async def _leave(self) -> None:
        try:
            await self._store.leave(self._models, self._me)
        except RedisError as exc:
            log.warning("could not give the dispatcher leases back (%s); they lapse", exc)
