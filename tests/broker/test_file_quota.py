"""Files' quota and expiry (``broker.batch.files``, ``file_reserve.lua``, ``file_release.lua``):
what an owner may hold is counted in Redis before a file's bytes are copied there, released
when the file is deleted, its upload fails, or it expires; every file's keys expire. Run
against a real Redis and fakeredis, like the broker contract suite."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from broker import keys
from broker.batch import NO_LIMIT, FilesQuotaExceeded, FileStore, Quota, expires_in_s
from broker.errors import InvalidRequest
from broker.settings.batch import BatchSettings

DAY_S = 86400


async def blocks(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def upload(store: FileStore, data: bytes, quota: Quota, keep_s: int = DAY_S) -> str:
    record = await store.create(
        "alice", "in.jsonl", "batch", blocks(data), keep_s=keep_s, size=len(data), quota=quota
    )
    return record.id


async def held(r: Redis, owner: str = "alice") -> tuple[int, int]:
    """(files, bytes) the owner's quota counts."""
    total = await r.hget(keys.owner_files_held(owner), "*")
    return await r.zcard(keys.owner_files_ends(owner)), int(total or 0)


def test_expires_after_is_openais_anchor_and_seconds_or_the_default() -> None:
    assert expires_in_s(None, None, 30 * DAY_S) == 30 * DAY_S
    assert expires_in_s("created_at", "3600", 30 * DAY_S) == 3600
    assert expires_in_s("created_at", str(30 * DAY_S), 30 * DAY_S) == 30 * DAY_S
    assert expires_in_s("created_at", "60", 60) == 60  # a keep under an hour is its own least
    for anchor, seconds in [
        ("last_active_at", "3600"),
        ("created_at", "3599"),
        ("created_at", str(30 * DAY_S + 1)),
        ("created_at", "soon"),
        (None, "3600"),
        ("created_at", None),
    ]:
        with pytest.raises(InvalidRequest, match="expires_after"):
            expires_in_s(anchor, seconds, 30 * DAY_S)


async def test_an_upload_past_the_owners_bytes_is_refused_until_a_file_is_deleted(
    r: Redis,
) -> None:
    store, quota = FileStore(r), Quota(max_bytes=1000, max_files=100)
    first = await upload(store, b"x" * 600, quota)
    with pytest.raises(FilesQuotaExceeded) as refused:
        await upload(store, b"y" * 500, quota)
    assert refused.value.status == 429 and refused.value.code == "files_quota_exceeded"
    assert refused.value.final  # x-should-retry: false
    message = refused.value.message
    assert "1000 bytes" in message and "600 bytes" in message and "delete files" in message
    assert await held(r) == (1, 600)
    assert await r.keys("fq:file:*:tmp") == []  # a refused upload never reached Redis
    await store.delete(first, "alice")
    assert await held(r) == (0, 0)
    await upload(store, b"y" * 500, quota)
    assert await held(r) == (1, 500)


async def test_an_upload_past_the_owners_file_count_is_refused(r: Redis) -> None:
    store, quota = FileStore(r), Quota(max_bytes=1 << 20, max_files=2)
    await upload(store, b"a", quota)
    await upload(store, b"b", quota)
    with pytest.raises(FilesQuotaExceeded, match="limit of 2 files"):
        await upload(store, b"c", quota)
    assert await held(r) == (2, 2)


async def test_owners_have_quotas_of_their_own(r: Redis) -> None:
    store, quota = FileStore(r), Quota(max_bytes=100, max_files=1)
    await upload(store, b"a" * 100, quota)
    await store.create("bob", "b.jsonl", "batch", blocks(b"b" * 100), keep_s=DAY_S, size=100,
                       quota=quota)  # fmt: skip
    assert await held(r, "bob") == (1, 100)


async def test_of_two_uploads_racing_for_the_last_bytes_only_one_is_stored(r: Redis) -> None:
    store, quota = FileStore(r), Quota(max_bytes=1000, max_files=100)
    await upload(store, b"x" * 400, quota)
    results = await asyncio.gather(
        *(upload(store, bytes([65 + i]) * 500, quota) for i in range(2)), return_exceptions=True
    )
    assert sorted(type(result).__name__ for result in results) == ["FilesQuotaExceeded", "str"]
    assert await held(r) == (2, 900)


async def test_every_file_expires_and_says_when(r: Redis) -> None:
    store = FileStore(r)
    record = await store.create("alice", "a.jsonl", "batch", blocks(b"abc"), keep_s=DAY_S)
    assert record.expires_at == record.created_at + DAY_S
    assert record.public()["expires_at"] == record.expires_at
    assert (await store.get(record.id, "alice")).expires_at == record.expires_at
    for key in (keys.file_meta(record.id), keys.file_data(record.id)):
        assert DAY_S - 5 <= await r.ttl(key) <= DAY_S
    assert await r.zscore(keys.owner_files_ends("alice"), record.id) == record.expires_at


async def test_an_expired_file_is_gone_and_frees_its_share_at_the_next_upload(r: Redis) -> None:
    store, quota = FileStore(r), Quota(max_bytes=1000, max_files=100)
    gone = await upload(store, b"x" * 900, quota, keep_s=1)
    await asyncio.sleep(2.1)  # TTLs have whole-second precision here
    assert not await r.exists(keys.file_meta(gone), keys.file_data(gone))
    kept = await upload(store, b"y" * 900, quota)
    assert await held(r) == (1, 900)
    records, _ = await store.list("alice", 10, None, None, newest_first=True)
    assert [f.id for f in records] == [kept]
    assert await r.zscore(keys.owner_files("alice"), gone) is None  # off the listing too


async def test_a_batchs_output_file_is_counted_but_never_refused(r: Redis) -> None:
    store, quota = FileStore(r), Quota(max_bytes=100, max_files=1)
    await upload(store, b"x" * 100, quota)
    output = await store.create("alice", "out.jsonl", "batch_output", blocks(b"o" * 50),
                                keep_s=DAY_S, file_id="file-b-output")  # fmt: skip
    assert await held(r) == (2, 150)
    await store.create("alice", "out.jsonl", "batch_output", blocks(b"o" * 70), keep_s=DAY_S,
                       quota=NO_LIMIT, file_id=output.id)  # fmt: skip  # a finalize rerun
    assert await held(r) == (2, 170)


async def test_an_upload_that_fails_midway_releases_its_share(r: Redis) -> None:
    store, quota = FileStore(r), Quota(max_bytes=1000, max_files=100)

    async def broken() -> AsyncIterator[bytes]:
        yield b"x" * 100
        raise ConnectionResetError("the client went away")

    with pytest.raises(ConnectionResetError):
        await store.create("alice", "a.jsonl", "batch", broken(), keep_s=DAY_S, size=800,
                           quota=quota)  # fmt: skip
    assert await held(r) == (0, 0)
    assert await r.keys("fq:file:*") == []


async def test_a_file_kept_for_a_batch_expires_later_and_counts_until_then(r: Redis) -> None:
    store = FileStore(r)
    record = await store.create("alice", "a.jsonl", "batch", blocks(b"abc"), keep_s=3600,
                                size=3, quota=Quota(1000, 10))  # fmt: skip
    kept = await store.keep_until(record, record.created_at + 5 * DAY_S)
    assert kept.expires_at == record.created_at + 5 * DAY_S
    assert (await store.get(record.id, "alice")).expires_at == kept.expires_at
    assert await r.ttl(keys.file_data(record.id)) > 4 * DAY_S
    assert await r.zscore(keys.owner_files_ends("alice"), record.id) == kept.expires_at
    assert await store.keep_until(kept, record.created_at + DAY_S) == kept  # never shortened


def test_a_quota_smaller_than_the_largest_upload_is_a_setting_error() -> None:
    with pytest.raises(ValueError, match=r"must be at least batch\.max_file_bytes"):
        BatchSettings(max_file_bytes=2048, owner_max_bytes=1024)


async def _plant_file_kept_forever(r: Redis, file_id: str, created_at: int, data: bytes) -> None:
    """A file as fairq stored it before files expired: no expires_at, no TTL, no quota."""
    await r.hset(
        keys.file_meta(file_id),
        mapping={"owner": "alice", "bytes": len(data), "created_at": created_at,
                 "filename": "old.jsonl", "purpose": "batch"},
    )  # fmt: skip
    await r.set(keys.file_data(file_id), data)
    await r.zadd(keys.owner_files("alice"), {file_id: created_at * 1_000_000})


async def test_files_stored_before_files_expired_get_an_end_and_count_against_the_quota(
    r: Redis,
) -> None:
    store, now = FileStore(r), 1_800_000_000
    quota = Quota(max_bytes=1000, max_files=100)
    recent, old = "file-recent", "file-old"
    await _plant_file_kept_forever(r, recent, now - 100, b"x" * 300)
    await _plant_file_kept_forever(r, old, now - 10 * DAY_S, b"y" * 200)
    kept = await upload(store, b"z" * 100, quota)  # a file of today: it has its end already
    kept_end = (await store.get(kept, "alice")).expires_at
    assert await store.end_files_kept_forever(DAY_S, now=now) == 2
    ends = {f: (await store.get(f, "alice")).expires_at for f in (recent, old, kept)}
    # A day after it was made; one made long ago gets an hour, not its end in the past.
    assert ends == {recent: now - 100 + DAY_S, old: now + 3600, kept: kept_end}
    for file_id in (recent, old):
        assert await r.expiretime(keys.file_meta(file_id)) == ends[file_id]
        assert await r.expiretime(keys.file_data(file_id)) == ends[file_id]
    assert await held(r) == (3, 600)  # the two counted beside today's
    assert await store.end_files_kept_forever(DAY_S, now=now) == 0  # once is enough
