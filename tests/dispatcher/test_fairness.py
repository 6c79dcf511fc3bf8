"""Fair selection and admission on hand-made cases (pure code, no Redis).

The conformance tests run every registered policy against the contract of
``FairPolicy.plan``; the rest pin down each policy's own order.
"""

from __future__ import annotations

import pytest

from broker import BandBacklog, ModelSnapshot, Newcomer
from dispatcher.fairness import (
    POLICIES,
    FairPolicy,
    RoundRobin,
    TokenFair,
    plan_with_slots,
    policy,
)


def simulate(
    p: FairPolicy,
    queued: dict[str, int],
    arrivals: dict[int, str],
    steps: int,
    cost: dict[str, float] | None = None,
) -> list[str]:
    """Serve one job per step as the dispatcher and dispatch.lua would; return who was served.

    ``arrivals`` maps a step number to a user who arrives (with one job) before it;
    ``cost`` is each user's job cost over weight, charged where a pick asks for it.
    """
    scores: dict[str, float] = {}
    join = 0.0
    served: list[str] = []
    for user in queued:
        scores[user] = join
    for step in range(steps):
        if step in arrivals:
            user = arrivals[step]
            queued[user] = queued.get(user, 0) + 1
            scores.setdefault(user, join)
        backlog = sorted(((u, s) for u, s in scores.items()), key=lambda us: (us[1], us[0]))
        if not backlog:
            break
        (pick,) = p.plan("default", backlog, join, 1)
        served.append(pick.user)
        after = pick.score_after
        if after is None:  # a cost charge, applied as dispatch.lua does
            join = scores[pick.user]
            after = join + (cost or {}).get(pick.user, 1.0)
        else:
            join = pick.join_after
        queued[pick.user] -= 1
        if queued[pick.user] == 0:
            del scores[pick.user]
        else:
            scores[pick.user] = after
    return served


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_picks_only_backlogged_users_and_at_most_n(name: str) -> None:
    picks = POLICIES[name].plan("default", [("a", 0.0), ("b", 0.0)], 0.0, 5)
    assert len(picks) == 5
    assert {p.user for p in picks} <= {"a", "b"}
    assert all(p.band == "default" for p in picks)
    assert POLICIES[name].plan("default", [], 0.0, 3) == []


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_serves_a_newcomer_before_anyone_twice_in_a_row(name: str) -> None:
    served = simulate(POLICIES[name], {"power": 500}, arrivals={5: "newcomer"}, steps=8)
    assert served[:5] == ["power"] * 5
    assert served[5] == "newcomer"


def test_round_robin_alternates_between_backlogged_users() -> None:
    served = simulate(RoundRobin(), {"a": 3, "b": 3, "c": 1}, arrivals={}, steps=7)
    assert served == ["a", "b", "c", "a", "b", "a", "b"]


def test_round_robin_plan_of_several_picks_rotates_users() -> None:
    picks = RoundRobin().plan("default", [("a", 1.0), ("b", 2.0)], 1.5, 4)
    assert [p.user for p in picks] == ["a", "b", "a", "b"]
    assert [p.score_after for p in picks] == [3.0, 4.0, 5.0, 6.0]
    assert picks[-1].join_after == 5.5


def test_a_late_user_waits_at_most_one_round() -> None:
    served = simulate(RoundRobin(), {"a": 10, "b": 10, "c": 10}, arrivals={4: "d"}, steps=12)
    assert "d" in served[4:7]


def test_unknown_policy_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown fairness policy 'fifo'"):
        policy("fifo")


def test_a_cached_view_with_newcomers_orders_them_like_redis_would() -> None:
    backlog = BandBacklog("default", [("a", 1.0), ("b", 3.0)], 2.5)
    view = ModelSnapshot([backlog], {"http://e": 1}, {})
    merged = view.with_newcomers(
        ["interactive", "default", "batch"],
        [Newcomer("default", "c", 2.5), Newcomer("interactive", "d", 0.0)],
    )
    assert [b.band for b in merged.backlogs] == ["interactive", "default"]
    assert merged.backlogs[1].users == [("a", 1.0), ("c", 2.5), ("b", 3.0)]
    assert merged.backlogs[0] == BandBacklog("interactive", [("d", 0.0)], 0.0)
    assert merged.inflight == {"http://e": 1} and view.backlogs[0].users[1] == ("b", 3.0)


def test_token_fair_serves_cheap_jobs_more_often_than_expensive_ones() -> None:
    served = simulate(
        TokenFair(), {"big": 100, "small": 100}, {}, steps=44, cost={"big": 10.0, "small": 1.0}
    )
    assert served.count("small") == 40 and served.count("big") == 4


def test_token_fair_honours_weights_as_cost_over_weight() -> None:
    # Equal jobs; a key of weight 2 pays half per job, so it is served twice as often.
    served = simulate(
        TokenFair(), {"heavy": 100, "light": 100}, {}, steps=30, cost={"heavy": 0.5, "light": 1.0}
    )
    assert served.count("heavy") == 20 and served.count("light") == 10


def test_token_fair_returning_user_cannot_bank_idle_time() -> None:
    # "late" arrives after "busy" received 50 units: it joins at the current minimum,
    # so it alternates with "busy" instead of being served 50 times in a row.
    served = simulate(TokenFair(), {"busy": 200}, {50: "late", 51: "late", 52: "late"}, steps=60)
    assert served[50:56].count("busy") >= 2


# --- kept slots: users with nothing in the engine, one pick each ---------------------------


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_full_batch_plans_each_newcomer_once_and_skips_users_in_the_engine(name: str) -> None:
    backlog = [("alice", 0.0), ("bob", 1.0), ("carol", 2.0)]
    picks = plan_with_slots(
        policy(name), "default", backlog, 0.0, room=5, served_room=0, in_engine={"alice"}
    )
    assert [p.user for p in picks] == ["bob", "carol"]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_free_slots_follow_the_policy_then_the_rest_goes_to_newcomers(name: str) -> None:
    backlog = [("alice", 0.0), ("dave", 0.5), ("bob", 1.0)]
    picks = plan_with_slots(
        policy(name), "default", backlog, 0.0, room=3, served_room=1, in_engine={"alice", "dave"}
    )
    assert [p.user for p in picks] == ["alice", "bob"]


def test_without_a_binding_batch_the_plan_is_the_policys_own() -> None:
    backlog = [("alice", 0.0), ("bob", 1.0)]
    plain = RoundRobin().plan("default", backlog, 0.0, 4)
    slots = plan_with_slots(
        RoundRobin(), "default", backlog, 0.0, room=4, served_room=4, in_engine={"alice"}
    )
    assert slots == plain


def test_a_newcomer_picked_once_is_in_the_engine_for_the_rest_of_the_plan() -> None:
    picks = plan_with_slots(
        RoundRobin(), "default", [("bob", 0.0)], 0.0, room=3, served_room=0, in_engine=()
    )
    assert [p.user for p in picks] == ["bob"]
