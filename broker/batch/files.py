"""Files of the Batch API, stored in Redis so that every gateway replica reads them.

A file is a metadata hash and a string with its bytes (see ``broker.keys``); its
memory cost in Redis is about its size. Uploads arrive and are written in
blocks, and content is read back in blocks (``GETRANGE``): no process holds a
whole file. Output files are written under a temporary key and renamed into
place, so writing one again (a finalize that was interrupted) replaces it whole.
An upload with an Idempotency-Key (``create_once``) stores its file in the transaction
that records the key's claim (``broker.idempotency``), so a retry gets the first file.

Every file expires (``expires_at``: its keys have that EXPIREAT) and counts against its
owner's quota (``file_reserve.lua``) from before its bytes reach Redis, when its size is
known (an upload: the spool's), or once they have (a batch's output, never refused),
until it is deleted, its upload fails, or it expires (released at the owner's next
upload). While a file is copied in, its share counts for an hour only, so a gateway that
dies mid-copy leaks no quota for longer. A file stored by a fairq from before files
expired gets its end, and its count, when a batch worker starts (``end_files_kept_forever``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, replace
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from broker import idempotency, keys
from broker.batch.errors import FilesQuotaExceeded
from broker.errors import InvalidRequest, NotFound
from broker.idempotency import Idempotency
from broker.lua.file_release import file_release_call
from broker.lua.file_reserve import Outcome, Reservation, file_reserve_call
from broker.redis import replies

_COPYING_S = 3600  # how long an upload being copied in counts before it must be stored
EXPIRES_AFTER_MIN_S = 3600  # OpenAI's least expires_after.seconds


@dataclass(frozen=True, slots=True)
class Quota:
    """What one owner may hold; 0: no limit (the file is counted, never refused)."""

    max_bytes: int
    max_files: int


NO_LIMIT = Quota(0, 0)


def expires_in_s(anchor: object, seconds: object, keep_s: int) -> int:
    """How long an upload is kept: OpenAI's ``expires_after`` (anchor ``created_at``,
    ``seconds`` from an hour to ``keep_s``), or ``keep_s`` when it asks for nothing."""
    if anchor is None and seconds is None:
        return keep_s
    if anchor != "created_at":
        raise InvalidRequest(
            "expires_after[anchor] must be 'created_at' (the only anchor)",
            param="expires_after.anchor",
        )
    least = min(EXPIRES_AFTER_MIN_S, keep_s)
    if not isinstance(seconds, str) or not seconds.isdigit() or not least <= int(seconds) <= keep_s:
        raise InvalidRequest(
            f"expires_after[seconds] must be a whole number of seconds from {least} to {keep_s}",
            param="expires_after.seconds",
        )
    return int(seconds)


def quota_refusal(reservation: Reservation, size: int, quota: Quota) -> FilesQuotaExceeded:
    """The 429 of an upload ``file_reserve.lua`` refused: the limit, what is held, the way out."""
    held = f"you hold {reservation.files} files of {reservation.bytes} bytes"
    if reservation.outcome is Outcome.TOO_MANY_FILES:
        limit = f"the limit of {quota.max_files} files per owner (FAIRQ_BATCH__OWNER_MAX_FILES)"
    else:
        limit = (
            f"the limit of {quota.max_bytes} bytes ({quota.max_bytes / 2**20:.0f} MiB) per "
            f"owner (FAIRQ_BATCH__OWNER_MAX_BYTES) with this file's {size} bytes"
        )
    return FilesQuotaExceeded(
        f"file storage quota exceeded: {held}, and this upload would pass {limit}; delete "
        "files you no longer need (DELETE /v1/files/{file_id}) or wait for them to expire"
    )


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


@dataclass(frozen=True)
class FileRecord:
    id: str
    owner: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    expires_at: int | None = None  # None: stored before files expired, not yet given an end

    @classmethod
    def from_hash(cls, file_id: str, h: replies.Hash) -> FileRecord:
        expires_at = h.get(b"expires_at")
        return cls(
            id=file_id,
            owner=h[b"owner"].decode(),
            bytes=int(h[b"bytes"]),
            created_at=int(h[b"created_at"]),
            filename=h[b"filename"].decode(),
            purpose=h[b"purpose"].decode(),
            expires_at=int(expires_at) if expires_at else None,
        )

    def public(self) -> dict[str, object]:
        """OpenAI's file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": self.expires_at,
        }


def _store(pipe: Pipeline, record: FileRecord) -> None:
    """Queue the commands that put an uploaded file (its temporary key) in place, to
    expire at its ``expires_at``, counted until then."""
    meta, data, ends = keys.file_meta(record.id), keys.file_data(record.id), record.expires_at
    if record.bytes:
        pipe.rename(keys.file_tmp(record.id), data)
    else:
        pipe.delete(data)
    pipe.hset(
        meta,
        mapping={
            "owner": record.owner,
            "bytes": record.bytes,
            "created_at": record.created_at,
            "filename": record.filename,
            "purpose": record.purpose,
            "expires_at": cast(int, ends),
        },
    )
    pipe.expireat(meta, cast(int, ends))
    if record.bytes:
        pipe.expireat(data, cast(int, ends))
    pipe.zadd(keys.owner_files(record.owner), {record.id: time.time_ns() // 1000})
    # XX: an upload whose reservation lapsed while it was copied stays uncounted rather
    # than be counted without its bytes (``file_reserve.lua`` keeps the two together).
    pipe.zadd(keys.owner_files_ends(record.owner), {record.id: cast(int, ends)}, xx=True)


class FileStore:
    def __init__(self, redis: Redis, block_bytes: int = 1 << 20) -> None:
        self._redis = redis
        self._block = block_bytes

    async def create(
        self,
        owner: str,
        filename: str,
        purpose: str,
        blocks: AsyncIterable[bytes],
        *,
        keep_s: int,
        size: int | None = None,
        quota: Quota = NO_LIMIT,
        file_id: str | None = None,
    ) -> FileRecord:
        """Store a file from its blocks, to expire after ``keep_s``; replaces a file of the
        same id whole. ``size``, when known, is counted against ``quota`` before a byte is
        copied (FilesQuotaExceeded); otherwise the bytes copied are, once they are."""
        file_id = file_id or new_file_id()
        record = await self._copy(
            owner,
            file_id,
            filename=filename,
            purpose=purpose,
            blocks=blocks,
            keep_s=keep_s,
            size=size,
            quota=quota,
        )
        async with self._redis.pipeline(transaction=True) as pipe:
            _store(pipe, record)
            await pipe.execute()
        return record

    async def create_once(
        self,
        once: Idempotency,
        owner: str,
        filename: str,
        purpose: str,
        blocks: AsyncIterable[bytes],
        *,
        keep_s: int,
        size: int | None = None,
        quota: Quota = NO_LIMIT,
    ) -> tuple[FileRecord, bool]:
        """``create``, once per Idempotency-Key: (the file the key made, whether it was
        made now). IdempotencyKeyReused when the key is another upload's; a file the key
        made and that was deleted since is IdempotentResultGone, not made again."""
        made = await idempotency.made(self._redis, once)
        if made is None:  # most likely the first try: upload, then store it with the claim
            file_id = new_file_id()
            record = await self._copy(
                owner,
                file_id,
                filename=filename,
                purpose=purpose,
                blocks=blocks,
                keep_s=keep_s,
                size=size,
                quota=quota,
            )
            made, created = await idempotency.create_once(
                self._redis, once, file_id, lambda pipe: _store(pipe, record)
            )
            if created:
                return record, True
            await self._discard(owner, file_id)  # another try stored it first
        try:
            return await self.get(made, owner), False
        except NotFound:
            raise idempotency.object_gone("file", made) from None

    async def _copy(
        self,
        owner: str,
        file_id: str,
        *,
        filename: str,
        purpose: str,
        blocks: AsyncIterable[bytes],
        keep_s: int,
        size: int | None,
        quota: Quota,
    ) -> FileRecord:
        """The file's bytes in its temporary key, counted against ``quota``: its record."""
        copying_until = int(time.time()) + _COPYING_S
        if size is not None:
            await self._reserve(owner, file_id, size, copying_until, quota)
        try:
            copied = await self._upload(file_id, blocks)
            if copied != size:
                await self._reserve(owner, file_id, copied, copying_until, quota)
        except BaseException:
            await self._discard(owner, file_id)
            raise
        now = int(time.time())
        return FileRecord(file_id, owner, copied, now, filename, purpose, now + keep_s)

    async def _reserve(self, owner: str, file_id: str, size: int, until: int, quota: Quota) -> None:
        call = file_reserve_call(
            owner,
            file_id,
            size,
            ends_at_s=until,
            max_bytes=quota.max_bytes,
            max_files=quota.max_files,
        )
        reservation = await call.run(self._redis)
        if reservation.outcome is not Outcome.COUNTED:
            raise quota_refusal(reservation, size, quota)

    async def _discard(self, owner: str, file_id: str) -> None:
        """Drop an upload that will not be stored: its bytes and its share of the quota."""
        await self._redis.delete(keys.file_tmp(file_id))
        await file_release_call(owner, file_id).run(self._redis)

    async def end_files_kept_forever(self, keep_s: int, now: int | None = None) -> int:
        """Give each file stored before files expired (no ``expires_at``: its keys never
        expire, and no quota counts it) an end, ``keep_s`` after it was made but not
        within the hour (a deployment that upgrades loses no file it reads at once), and
        count it against its owner's quota until then, as any other. Returns how many.
        Reads every owner's listing: a batch worker runs it once as it starts."""
        now = int(time.time()) if now is None else now
        ended = 0
        prefix = keys.owner_files("")[:-1]  # fq:files:{
        async for key in self._redis.scan_iter(match=keys.owner_files("*"), count=1000):
            owner = key.decode()[len(prefix) : -1]
            if key.decode() != keys.owner_files(owner):
                continue  # an owner's :held or :ends
            for member in replies.members(await self._redis.zrange(key, 0, -1)):
                h = replies.hash_reply(await self._redis.hgetall(keys.file_meta(member.decode())))
                if h and not h.get(b"expires_at"):
                    record = FileRecord.from_hash(member.decode(), h)
                    until = max(record.created_at + keep_s, now + EXPIRES_AFTER_MIN_S)
                    await self._end(record, until)
                    ended += 1
        return ended

    async def _end(self, record: FileRecord, until: int) -> None:
        reserve = file_reserve_call(
            record.owner, record.id, record.bytes, ends_at_s=until, max_bytes=0, max_files=0
        )
        await reserve.run(self._redis)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.file_meta(record.id), "expires_at", until)
            pipe.expireat(keys.file_meta(record.id), until)
            pipe.expireat(keys.file_data(record.id), until)
            await pipe.execute()

    async def keep_until(self, record: FileRecord, until: int) -> FileRecord:
        """The file kept (and counted) until at least ``until``: a batch's input file for
        as long as the batch may read it. Its ``expires_at`` shows the new end."""
        if record.expires_at is None or record.expires_at >= until:
            return record
        meta, data = keys.file_meta(record.id), keys.file_data(record.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(meta, "expires_at", until)
            pipe.expireat(meta, until)
            if record.bytes:
                pipe.expireat(data, until)
            pipe.zadd(keys.owner_files_ends(record.owner), {record.id: until}, xx=True, gt=True)
            await pipe.execute()
        return replace(record, expires_at=until)

    async def _upload(self, file_id: str, blocks: AsyncIterable[bytes]) -> int:
        """The file's bytes, appended to its temporary key; their count (the caller drops
        the key if this raises)."""
        tmp = keys.file_tmp(file_id)
        await self._redis.delete(tmp)
        size = 0
        async for block in blocks:
            if block:
                size = await self._redis.append(tmp, block)
        return size

    async def get(self, file_id: str, owner: str | None) -> FileRecord:
        """The file; NotFound if there is none or it is someone else's (``owner=None``: any)."""
        h = replies.hash_reply(await self._redis.hgetall(keys.file_meta(file_id)))
        if not h or (owner is not None and h.get(b"owner", b"").decode() != owner):
            raise NotFound(f"No such File object: {file_id}", code="file_not_found")
        return FileRecord.from_hash(file_id, h)

    async def list(
        self, owner: str, limit: int, after: str | None, purpose: str | None, newest_first: bool
    ) -> tuple[list[FileRecord], bool]:
        """A page of the owner's files and whether more follow."""
        found = await self._redis.zrange(keys.owner_files(owner), 0, -1, desc=newest_first)
        ids = [i.decode() for i in replies.members(found)]
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        records: list[FileRecord] = []
        for file_id in ids:
            if len(records) > limit:
                break
            h = replies.hash_reply(await self._redis.hgetall(keys.file_meta(file_id)))
            if h and (purpose is None or h.get(b"purpose") == purpose.encode()):
                records.append(FileRecord.from_hash(file_id, h))
        return records[:limit], len(records) > limit

    async def blocks(self, file_id: str, start: int = 0) -> AsyncIterator[bytes]:
        """The file's bytes from ``start`` on, one block at a time."""
        key = keys.file_data(file_id)
        while True:
            block = cast(bytes, await self._redis.getrange(key, start, start + self._block - 1))
            if not block:
                return
            yield block
            start += len(block)

    async def delete(self, file_id: str, owner: str) -> None:
        record = await self.get(file_id, owner)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.file_meta(file_id), keys.file_data(file_id))
            pipe.zrem(keys.owner_files(record.owner), file_id)
            file_release_call(record.owner, file_id).queue(pipe)
            await pipe.execute()
