"""The KEDA scaler's pure parts: what a trigger names (``scaler.target``) and the
board that tells open streams when a model's activity flips (``scaler.board``).
The process itself, with real Redis and a real gRPC client: tests/integration/
test_keda_scaler.py."""

from __future__ import annotations

import asyncio

import pytest

from scaler.board import DemandBoard, Stale
from scaler.target import BadTrigger, Target, demand_of, target_of


def test_a_trigger_names_its_model_and_the_demand_one_replica_serves() -> None:
    assert target_of({"model": "m", "demandPerReplica": "32"}, ["m"]) == Target("m", 32.0)
    assert target_of({"model": "m"}, ["m"]) == Target("m", 1.0)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({}, "names no model: add `model: <fairq model name>`"),
        ({"model": "other"}, "^model 'other' is not served by this scaler: fix the trigger"),
        ({"model": "m", "demandPerReplica": "0"}, "must be a number above 0"),
        ({"model": "m", "demandPerReplica": "lots"}, "'lots': it must be a number"),
    ],
)
def test_a_trigger_it_cannot_answer_is_refused_saying_what_to_fix(
    metadata: dict[str, str], message: str
) -> None:
    with pytest.raises(BadTrigger, match=message):
        target_of(metadata, ["m"])


def test_a_refusal_names_what_the_trigger_sent_cut_short_never_the_models_served() -> None:
    with pytest.raises(BadTrigger) as refused:
        target_of({"model": "y" * 1000}, ["m", "another-teams-model"])
    message = str(refused.value)
    assert "another-teams-model" not in message and "'m'" not in message
    assert f"'{'y' * 64}'..." in message and "y" * 65 not in message


def test_demand_is_queued_in_every_band_plus_in_flight_a_negative_band_as_zero() -> None:
    queued = {b"interactive": b"2", b"batch": b"-1"}
    inflight = {b"http://a:8000": b"3", b"http://b:8000": b"0"}
    assert demand_of(queued, inflight) == 5
    assert demand_of({}, {}) == 0


async def test_a_listener_is_told_when_activity_flips_not_when_demand_only_moves() -> None:
    board = DemandBoard(["m", "n"], stale_after_s=60)
    listener = board.listen("m")
    assert listener.changed.is_set(), "a stream sends the current state first"
    listener.changed.clear()
    assert board.update({"m": 0, "n": 0}, complete=True) == ["m", "n"]  # first read: known
    listener.changed.clear()
    assert board.update({"m": 3}, complete=False) == ["m"]
    assert listener.changed.is_set() and board.demand("m") == 3
    listener.changed.clear()
    assert board.update({"m": 7, "n": 0}, complete=True) == []
    assert not listener.changed.is_set()
    assert board.update({"m": 0}, complete=False) == ["m"] and listener.changed.is_set()
    board.forget(listener)
    assert board.streams() == 0


async def test_a_board_not_read_recently_refuses_to_answer() -> None:
    board = DemandBoard(["m"], stale_after_s=0.05)
    with pytest.raises(Stale, match="not read from Redis"):
        board.demand("m")  # never read
    board.update({"m": 1}, complete=True)
    assert board.demand("m") == 1
    await asyncio.sleep(0.08)
    with pytest.raises(Stale, match="is Redis reachable"):
        board.demand("m")


async def test_a_fresh_read_after_a_stale_spell_tells_every_listener_even_unchanged() -> None:
    board = DemandBoard(["m"], stale_after_s=0.05)
    board.update({"m": 2}, complete=True)
    listener = board.listen("m")
    listener.changed.clear()
    await asyncio.sleep(0.08)  # stale: a stream woken now could not send
    assert board.update({"m": 2}, complete=False) == [] and not listener.changed.is_set()
    assert board.update({"m": 2}, complete=True) == []
    assert listener.changed.is_set(), "fresh again: the stream sends what it could not"
