"""The service tier the worker writes into a job's output (pure): every event of vLLM's own
captured streams, one per piece or many, an engine's own member replaced, whole bodies."""

from __future__ import annotations

import orjson
import pytest

from broker import RequestKind, Settings
from tests.support.paths import FIXTURES
from workers.engine import Accounting
from workers.service_tier import TierStamp, TierStamps
from workers.whole import WholeAnswer

VLLM = FIXTURES / "vllm-0.32-cpu"
CAPTURES = ["sse_sample_with_headers_chat.txt", "sse_sample_with_headers_completions.txt"]
FLEX = TierStamp("flex")


def events_of(name: str) -> list[bytes]:
    """The capture's events as the engine's accounting hands them on (usage kept)."""
    body = (VLLM / name).read_bytes().split(b"\r\n\r\n", 1)[1]  # after the headers
    accounting = Accounting()
    pieces = [accounting.scan(e + b"\n\n", keep_usage=True) for e in body.split(b"\n\n")]
    return [piece for piece in pieces if piece]


def parsed(events: bytes) -> list[dict[str, object]]:
    assert events.endswith(b"\n\n")
    return [orjson.loads(e.removeprefix(b"data: ")) for e in events.split(b"\n\n")[:-1]]


@pytest.mark.parametrize("name", CAPTURES)
def test_every_event_says_the_tier_and_keeps_the_rest(name: str) -> None:
    events = events_of(name)
    one_by_one = [chunk for piece in events for chunk in parsed(FLEX.events(piece))]
    at_once = parsed(FLEX.events(b"".join(events)))
    engine = parsed(b"".join(events))
    assert one_by_one == at_once == [chunk | {"service_tier": "flex"} for chunk in engine]
    assert any(chunk.get("usage") for chunk in at_once)  # the usage chunk too


def test_an_engines_own_tier_is_replaced_not_repeated() -> None:
    events = (
        b'data: {"id":"c","service_tier":null,"choices":[]}\n\n'
        b'data: {"id":"c","service_tier":"default","choices":[]}\n\n'
        b'data: {"id":"c","choices":[]}\n\n'
    )
    stamped = FLEX.events(events)
    assert stamped.count(b'"service_tier"') == 3
    assert [chunk["service_tier"] for chunk in parsed(stamped)] == ["flex"] * 3


def test_a_whole_body_says_the_tier_in_place_of_the_engines_null() -> None:
    body = b'{"id":"c","choices":[],"service_tier":null,"usage":{"completion_tokens":1}}'
    stamped = FLEX.body(body)
    assert list(orjson.loads(stamped)) == ["id", "choices", "service_tier", "usage"]
    assert orjson.loads(stamped)["service_tier"] == "flex"


def test_a_rebuilt_whole_answer_says_the_tier_it_is_given() -> None:
    answer = WholeAnswer(RequestKind.CHAT)
    answer.add(b'data: {"id":"c","model":"m","service_tier":"default","choices":[]}\n\n')
    assert orjson.loads(answer.body(None, "priority"))["service_tier"] == "priority"
    assert orjson.loads(answer.body(None))["service_tier"] == "default"  # the engine's


def test_each_band_gets_the_stamp_of_its_tier() -> None:
    stamps = TierStamps(Settings())
    assert [stamps.of(band).tier for band in ("interactive", "default", "batch")] == [
        "priority",
        "default",
        "flex",
    ]
    assert stamps.of("not-configured").tier == "default"
