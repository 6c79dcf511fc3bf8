"""Fair selection inside a band: which user goes next (pure, no I/O).

A policy turns a snapshot of a band's backlog -- the lowest-scored users with
their scores, and the band's join score -- into a plan of ``n`` picks, each
with the user's score after service (or ``None``: charge the job's own cost,
which only the dispatch script sees) and the band's new join score. Redis keeps
users ordered by score; the dispatch script applies the plan atomically.

Policies are registered by name; ``tests/dispatcher/test_fairness.py`` runs every
registered policy against the shared contract.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from typing import Protocol

from broker import Pick

Backlog = Sequence[tuple[str, float]]  # (user, score), ascending like the Redis zset


class FairPolicy(Protocol):
    name: str

    def plan(self, band: str, backlog: Backlog, join: float, n: int) -> list[Pick]:
        """Up to ``n`` picks in service order, assuming each user has jobs enough.

        Contract: only users of ``backlog`` are picked; a user who was idle and
        joins at ``join`` is served before any user is served twice in a row.
        """
        ...


class RoundRobin:
    """Per-request round-robin: serve the longest-unserved user, then send them to the back.

    The score is a per-band service clock: a served user gets ``clock + 1`` and
    the clock advances; a user who becomes backlogged joins at ``clock - 0.5``,
    i.e. at the end of the current round but before the user served last.
    """

    name = "round_robin"

    def plan(self, band: str, backlog: Backlog, join: float, n: int) -> list[Pick]:
        clock = join + 0.5
        heap = [(score, user) for user, score in backlog]
        heapq.heapify(heap)
        picks: list[Pick] = []
        while heap and len(picks) < n:
            _, user = heapq.heappop(heap)
            clock += 1
            picks.append(Pick(band, user, score_after=clock, join_after=clock - 0.5))
            heapq.heappush(heap, (clock, user))
        return picks


class TokenFair:
    """Token-fair (a virtual token counter): serve the user with the least weighted service.

    A user's score is the service they have received, in weighted tokens divided by
    their key's weight and multiplied by the number of backlogged users of their
    tenant: tenants share by weight, and users inside a tenant share equally (a
    trusted app's end users are users of the app's tenant). The job's size is
    known where the job is popped, so the
    dispatch script charges each job's estimated cost as it dispatches it
    (``score_after=None``), and the job's completion corrects the charge to the
    engine's reported usage. A user who becomes backlogged joins at the score of the
    user served last -- the current minimum -- so idle time is never banked as credit.
    The plan's order assumes equal costs; the next round reads the real scores.
    """

    name = "token_fair"
    _NOMINAL = 1.0

    def plan(self, band: str, backlog: Backlog, join: float, n: int) -> list[Pick]:
        heap = [(score, user) for user, score in backlog]
        heapq.heapify(heap)
        picks: list[Pick] = []
        while heap and len(picks) < n:
            score, user = heapq.heappop(heap)
            picks.append(Pick(band, user, score_after=None, join_after=score))
            heapq.heappush(heap, (score + self._NOMINAL, user))
        return picks


POLICIES: dict[str, FairPolicy] = {p.name: p for p in (RoundRobin(), TokenFair())}


def plan_with_slots(
    fair: FairPolicy,
    band: str,
    backlog: Backlog,
    join: float,
    *,
    room: int,
    served_room: int,
    in_engine: Collection[str],
) -> list[Pick]:
    """Up to ``room`` picks in the policy's order, of which at most ``served_room`` serve a
    user who already has a job in the engine (``in_engine``, or picked earlier in the plan).

    When the batch is full for them (kept slots), the policy's order is followed until the
    first pick it cannot make; what is left of the room goes to users with nothing in the
    engine, one pick each, again in the policy's order. Those skipped keep their scores, so
    their place: they are next once a slot frees.
    """
    if served_room >= room:
        return fair.plan(band, backlog, join, room)
    busy = set(in_engine)
    picks: list[Pick] = []
    left = served_room
    for pick in fair.plan(band, backlog, join, room):
        if pick.user in busy:
            if left == 0:
                break
            left -= 1
        picks.append(pick)
        busy.add(pick.user)
    idle = [(user, score) for user, score in backlog if user not in busy]
    if idle and len(picks) < room:
        after = picks[-1].join_after if picks else join
        for pick in fair.plan(band, idle, after, room - len(picks)):
            if pick.user not in busy:
                picks.append(pick)
                busy.add(pick.user)
    return picks


def policy(name: str) -> FairPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown fairness policy {name!r}; known: {', '.join(POLICIES)}"
        ) from None
