"""Routing: which of a model's endpoints with room each pick goes to (pure, no I/O).

``least_loaded`` sends a round's picks to the one endpoint admission likes best
(``admission.choose_endpoint``: the most room). ``prefix`` keeps each user's
requests on one replica, where the engine's prefix cache most likely holds their
conversation (a chat's earlier turns, an agent's growing context, the system prompt
they share): rendezvous hashing on the user picks each user's replica, and a
replica takes the pick only while its jobs in flight stay within ``load_bound``
times the mean over the model's healthy endpoints (consistent hashing with bounded
loads, Mirrokni, Thorup and Zadimoghaddam 2018), else the next in the user's
rendezvous order, so one user's flood spills over rather than piling up on one
replica. A replica that appears or leaves moves only the users it wins or held.

Why the user and not a hash of the prompt's first messages: a round's picks are
users (the fair pick), and the job a pick dispatches is its user's head job, which
the dispatcher does not read; a key of the job's text would cost a read of every
picked job per round. Agents and chat apps that name their end users (OpenAI's
``user``, a trusted app's key) make the user the owner of a conversation. Traffic of
one user with many unrelated conversations keeps its locality only up to the bound.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from broker import Pick
from dispatcher.admission import (
    AdmissionConfig,
    AdmissionPolicy,
    Decision,
    EndpointState,
    choose_endpoint,
)

Routing = Literal["least_loaded", "prefix"]
ROUTINGS: tuple[Routing, ...] = ("least_loaded", "prefix")


def open_endpoints(
    routing: Routing,
    policy: AdmissionPolicy,
    states: Sequence[EndpointState],
    band: str,
    config: AdmissionConfig,
) -> list[Decision]:
    """The endpoints a round may send ``band``'s picks to: admission's best one
    (least_loaded), or every endpoint with room (prefix)."""
    if routing == "least_loaded":
        best = choose_endpoint(policy, states, band, config)
        return [] if best is None else [best]
    decisions = (policy.decide(state, band, config) for state in states)
    return [d for d in decisions if d.room > 0]


def round_room(routing: Routing, decisions: Sequence[Decision], backlogged: int) -> int:
    """Picks one round may plan. Under prefix routing at most one per backlogged user: a
    pick names a user, not a job, so a user's picks beyond their queue dispatch nothing,
    and split over endpoints they would take the user's jobs to the first endpoint sent
    to whatever the plan said; the next round routes the user's next job on fresh loads."""
    room = sum(d.room for d in decisions)
    return room if routing == "least_loaded" else min(room, backlogged)


def rendezvous(key: str, endpoints: Collection[str]) -> list[str]:
    """``endpoints`` in ``key``'s order of preference: highest random weight first.
    Stable for a key whatever other endpoints come and go."""

    def weight(endpoint: str) -> bytes:
        return hashlib.blake2b(f"{endpoint}\n{key}".encode(), digest_size=8).digest()

    return sorted(endpoints, key=weight, reverse=True)


def bounded_choice(
    key: str, candidates: Collection[str], loads: Mapping[str, int], load_bound: float
) -> str:
    """The first of ``candidates`` in ``key``'s rendezvous order whose load after one more
    job stays within ``load_bound`` x the mean load (over every endpoint in ``loads``, one
    more job counted), else the least loaded candidate (first listed on a tie)."""
    total = sum(loads.values()) + 1
    cap = math.ceil(load_bound * total / max(1, len(loads)))
    for endpoint in rendezvous(key, candidates):
        if loads.get(endpoint, 0) + 1 <= cap:
            return endpoint
    return min(candidates, key=lambda endpoint: loads.get(endpoint, 0))


def assign(
    routing: Routing,
    picks: Sequence[Pick],
    decisions: Sequence[Decision],
    loads: Mapping[str, int],
    in_engine: Collection[str],
    *,
    load_bound: float,
) -> list[tuple[Decision, list[Pick]]]:
    """Each pick's endpoint, within each endpoint's room (``room`` for any pick,
    ``room_for_served`` for a user with a job in the engine or picked earlier), grouped
    by endpoint in the order the endpoints were first chosen; a user picked twice stays
    where their first pick went while it has room. A pick no endpoint has room for is
    left out: its user keeps their place in the queue."""
    if routing == "least_loaded" or len(decisions) == 1:
        return [(decisions[0], list(picks))] if decisions and picks else []
    room = {d.endpoint: d.room for d in decisions}
    served = {d.endpoint: d.room_for_served for d in decisions}
    load = dict(loads)
    busy = set(in_engine)
    groups: dict[str, list[Pick]] = {}
    chosen: dict[str, str] = {}
    for pick in picks:
        fits = [e for e in room if room[e] > 0 and (pick.user not in busy or served[e] > 0)]
        if not fits:
            continue
        endpoint = chosen.get(pick.user, "")
        if endpoint not in fits:
            endpoint = chosen[pick.user] = bounded_choice(pick.user, fits, load, load_bound)
        room[endpoint] -= 1
        if pick.user in busy:
            served[endpoint] -= 1
        load[endpoint] = load.get(endpoint, 0) + 1
        busy.add(pick.user)
        groups.setdefault(endpoint, []).append(pick)
    by_name = {d.endpoint: d for d in decisions}
    return [(by_name[endpoint], group) for endpoint, group in groups.items()]


@dataclass(frozen=True)
class Router:
    """The round's stage that says where each pick goes: ``least_loaded`` or ``prefix``
    (each user's jobs to one replica, within ``load_bound`` x the mean load)."""

    name: Routing
    load_bound: float = 1.0

    def open(
        self,
        policy: AdmissionPolicy,
        states: Sequence[EndpointState],
        band: str,
        config: AdmissionConfig,
    ) -> list[Decision]:
        """The endpoints a round may send ``band``'s picks to (``open_endpoints``)."""
        return open_endpoints(self.name, policy, states, band, config)

    def room(self, decisions: Sequence[Decision], backlogged: int) -> int:
        """Picks one round may plan (``round_room``)."""
        return round_room(self.name, decisions, backlogged)

    def assign(
        self,
        picks: Sequence[Pick],
        decisions: Sequence[Decision],
        loads: Mapping[str, int],
        in_engine: Collection[str],
    ) -> list[tuple[Decision, list[Pick]]]:
        """Each pick's endpoint (``assign``)."""
        return assign(self.name, picks, decisions, loads, in_engine, load_bound=self.load_bound)

    def express(self, endpoints: int) -> bool:
        """Whether new jobs may go straight to one endpoint from enqueue (express) while the
        model has ``endpoints`` of them: one grant names one endpoint, and express sends
        would ignore each user's replica."""
        return self.name == "least_loaded" or endpoints <= 1
