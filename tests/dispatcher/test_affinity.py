"""Routing among a model's replicas on hand-made cases: rendezvous order, the load bound,
and a round's picks spread over endpoints within their room."""

from __future__ import annotations

from broker import Pick
from dispatcher.admission import ADMISSION, AdmissionConfig, Decision, EndpointState, Limit
from dispatcher.affinity import assign, bounded_choice, open_endpoints, rendezvous

EPS = ("http://a", "http://b", "http://c", "http://d")
CONFIG = AdmissionConfig(targets={"default": 3}, tpot_ceiling_s=0.15, inflight_cap=8)


def pick(user: str) -> Pick:
    return Pick("default", user, score_after=1.0, join_after=0.5)


def decision(endpoint: str, room: int, served: int | None = None) -> Decision:
    return Decision(endpoint, room, Limit.QUEUE_TARGET, served_room=served)


def test_rendezvous_order_is_stable_and_a_removed_endpoint_moves_only_its_own_keys() -> None:
    users = [f"user-{i}" for i in range(200)]
    first = {u: rendezvous(u, EPS)[0] for u in users}
    assert {u: rendezvous(u, list(reversed(EPS)))[0] for u in users} == first
    assert set(first.values()) == set(EPS)  # every replica wins some users
    fewer = {u: rendezvous(u, EPS[:3])[0] for u in users}
    moved = {u for u in users if fewer[u] != first[u]}
    assert moved == {u for u in users if first[u] == EPS[3]}


def test_the_preferred_replica_takes_a_job_while_within_the_bound_then_the_next() -> None:
    key = "alice"
    order = rendezvous(key, EPS)
    idle = dict.fromkeys(EPS, 0)
    assert bounded_choice(key, EPS, idle, 1.25) == order[0]
    # 9 or 10 in flight over 4 replicas: the mean after one more x 1.25, rounded up, is 4.
    within = dict.fromkeys(EPS, 2) | {order[0]: 3}
    assert bounded_choice(key, EPS, within, 1.25) == order[0]
    loaded = dict.fromkeys(EPS, 2) | {order[0]: 4}
    assert bounded_choice(key, EPS, loaded, 1.25) == order[1]
    # Every candidate over the bound: the least loaded one.
    over = {order[0]: 9, order[1]: 9, order[2]: 0, order[3]: 0}
    assert bounded_choice(key, order[:2], over, 1.25) in order[:2]
    assert bounded_choice(key, [order[0], order[2]], over, 1.0) == order[2]


def test_least_loaded_sends_the_whole_round_to_admissions_best_endpoint() -> None:
    states = [
        EndpointState("http://a", inflight=2, fresh=True, waiting=2.0),
        EndpointState("http://b", inflight=0, fresh=True),
    ]
    metrics = ADMISSION["metrics"]
    best = open_endpoints("least_loaded", metrics, states, "default", CONFIG)
    assert [d.endpoint for d in best] == ["http://b"]
    every = open_endpoints("prefix", metrics, states, "default", CONFIG)
    assert sorted(d.endpoint for d in every) == ["http://a", "http://b"]
    picks = [pick("u1"), pick("u2")]
    routes = assign("least_loaded", picks, best, {}, [], load_bound=1.25)
    assert routes == [(best[0], picks)]


def test_prefix_keeps_each_users_picks_on_their_replica_within_its_room() -> None:
    users = ["ann", "bob", "cy", "dee", "eve", "fay"]
    decisions = [decision(ep, room=10) for ep in EPS]
    picks = [pick(u) for u in users for _ in range(2)]
    routes = assign("prefix", picks, decisions, dict.fromkeys(EPS, 0), [], load_bound=4.0)
    where = {p.user: d.endpoint for d, group in routes for p in group}
    assert all(where[u] == rendezvous(u, EPS)[0] for u in users)
    assert sum(len(group) for _, group in routes) == len(picks)


def test_prefix_spills_a_flood_over_the_bound_and_skips_what_no_room_takes() -> None:
    decisions = [decision(ep, room=3) for ep in EPS[:2]]
    picks = [pick("flood")] * 8
    routes = assign("prefix", picks, decisions, dict.fromkeys(EPS[:2], 0), [], load_bound=1.0)
    counts = {d.endpoint: len(group) for d, group in routes}
    assert counts == dict.fromkeys(EPS[:2], 3)  # spread within the bound; 2 picks left out


def test_a_user_with_a_job_in_the_engine_goes_only_where_batch_slots_are_free() -> None:
    home = rendezvous("busy", EPS[:2])[0]
    other = EPS[1] if home == EPS[0] else EPS[0]
    decisions = [decision(home, room=3, served=0), decision(other, room=3, served=1)]
    picks = [pick("busy"), pick("busy")]
    routes = assign("prefix", picks, decisions, dict.fromkeys(EPS[:2], 0), ["busy"], load_bound=2)
    assert [(d.endpoint, len(group)) for d, group in routes] == [(other, 1)]
