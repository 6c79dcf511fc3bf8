"""The worker's payload handling (pure): splicing in the engine priority as bytes."""

from __future__ import annotations

import orjson

from workers.runner import with_priority


def test_priority_is_spliced_into_the_json_object() -> None:
    payload = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "{x}"}]})
    spliced = orjson.loads(with_priority(payload, 1_000_003))
    assert spliced == {"priority": 1_000_003, **orjson.loads(payload)}


def test_an_empty_object_gets_just_the_priority() -> None:
    assert orjson.loads(with_priority(b"{}", 0)) == {"priority": 0}


def test_no_priority_leaves_the_payload_untouched() -> None:
    payload = b'{"model":"m"}'
    assert with_priority(payload, None) is payload
