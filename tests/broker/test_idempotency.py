"""``broker.idempotency`` on its own: what a key is, what a request's fingerprint holds,
where a key lives, and the claim of files and batches (fakeredis: no script runs here;
enqueue.lua's part is in test_idempotent_enqueue.py, on a real Redis)."""

from __future__ import annotations

import asyncio

import fakeredis
import pytest

from broker.errors import IdempotencyKeyReused, InvalidRequest
from broker.idempotency import (
    MAX_KEY_CHARS,
    Fingerprint,
    Idempotency,
    bind,
    check_key,
    create_once,
    fingerprint,
    made,
)

BODY = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def once(
    key: str = "k-1",
    *,
    owner: str = "alice",
    route: str = "chat",
    request: object = BODY,
    window_s: int = 60,
) -> Idempotency:
    return Idempotency.of(
        key, owner=owner, route=route, fingerprint=fingerprint(route, request), window_s=window_s
    )


@pytest.mark.parametrize(
    "key",
    ["0b6b3f4e-9a57-4c1b-9d3e-52f0c3e1a7aa", "a", "x" * MAX_KEY_CHARS, "retry 1: order #42"],
)
def test_a_key_of_printable_ascii_up_to_255_characters_is_taken_as_sent(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize(
    ("key", "said"),
    [
        ("", "is empty"),
        ("x" * (MAX_KEY_CHARS + 1), "256 characters long"),
        ("tab\there", "control or non-ASCII"),
        ("caf\u00e9", "control or non-ASCII"),
        ("bell\x07", "control or non-ASCII"),
        ("del\x7f", "control or non-ASCII"),
    ],
)
def test_a_key_that_is_not_one_is_refused_saying_what_a_key_must_be(key: str, said: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_key(key)
    error = refused.value
    assert error.status == 400 and error.code == "invalid_idempotency_key"
    assert said in error.message and "1 to 255 printable ASCII characters" in error.message


def test_the_fingerprint_ignores_key_order_at_every_depth_but_not_values() -> None:
    reordered = {"max_tokens": 5, "messages": [{"content": "hi", "role": "user"}], "model": "m1"}
    assert fingerprint("chat", BODY) == fingerprint("chat", reordered)
    assert fingerprint("chat", BODY) != fingerprint("chat", {**BODY, "max_tokens": 6})
    assert fingerprint("chat", BODY) != fingerprint("chat", {**BODY, "stream": True})
    # The order of a list is the request's: messages in another order are another chat.
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert fingerprint("chat", {"messages": two}) != fingerprint("chat", {"messages": two[::-1]})


def test_the_fingerprint_holds_the_route_and_every_part_that_decides_the_work() -> None:
    assert fingerprint("chat", BODY) != fingerprint("completion", BODY)
    assert fingerprint("chat", BODY, None) != fingerprint("chat", BODY, "batch")  # the band
    assert len(fingerprint("chat", BODY)) == 32


def test_a_files_fingerprint_covers_its_bytes_however_they_were_cut_into_blocks() -> None:
    def of(*blocks: bytes, name: str = "in.jsonl") -> str:
        found = Fingerprint("files", "batch", name)
        for block in blocks:
            found.add(block)
        return found.hexdigest()

    assert of(b"line 1\n", b"line 2\n") == of(b"line 1\nline 2\n")
    assert of(b"line 1\n") != of(b"line 2\n")
    assert of(b"x", name="a.jsonl") != of(b"x", name="b.jsonl")


def test_a_key_lives_in_its_owners_slot_and_its_job_record_in_the_models() -> None:
    key = once("secret-key-text")
    assert key.claim.startswith("fq:idem:{alice}:chat:")
    assert key.job_record("m1").startswith("fq:{m1}:idem:chat:alice:")
    assert "secret-key-text" not in key.claim + key.job_record("m1")  # only its digest
    scopes = {once().claim, once(owner="bob").claim, once(route="completion").claim}
    assert len(scopes) == 3  # per user and route: the same key three times, three keys


def test_a_key_that_is_not_one_is_refused_where_it_is_scoped() -> None:
    with pytest.raises(InvalidRequest):
        once("")


@pytest.fixture
async def fake() -> fakeredis.FakeAsyncRedis:
    return fakeredis.FakeAsyncRedis()


async def test_the_first_request_claims_the_key_for_the_window_and_only_it_may_reuse_it(
    fake: fakeredis.FakeAsyncRedis,
) -> None:
    first = once(window_s=90)
    await bind(fake, first)
    await bind(fake, first)  # the same request again: its claim
    assert 85 <= await fake.ttl(first.claim) <= 90
    other = once(request={**BODY, "max_tokens": 6}, window_s=90)
    with pytest.raises(IdempotencyKeyReused) as refused:
        await bind(fake, other)
    assert refused.value.status == 409 and refused.value.code == "idempotency_key_reused"
    assert "different request" in refused.value.message
    assert await fake.ttl(first.claim) <= 90  # a refusal does not lengthen the window


async def test_an_object_is_stored_once_per_key_with_its_claim(
    fake: fakeredis.FakeAsyncRedis,
) -> None:
    key = once(route="batches", request={"input_file_id": "file-1"})

    def writes(n: int) -> object:
        return lambda pipe: pipe.set(f"object-{n}", "stored")

    results = await asyncio.gather(
        *(create_once(fake, key, f"id-{n}", writes(n)) for n in range(5))
    )
    assert [created for _, created in results].count(True) == 1
    (winner,) = {made_id for made_id, _ in results}
    assert await made(fake, key) == winner
    assert await fake.keys("object-*") == [f"object-{winner.removeprefix('id-')}".encode()]
    other = once(route="batches", request={"input_file_id": "file-2"})
    with pytest.raises(IdempotencyKeyReused):
        await create_once(fake, other, "id-9", writes(9))
    with pytest.raises(IdempotencyKeyReused):
        await made(fake, other)
