"""Files of the Batch API, stored in Redis so that every gateway replica reads them.

A file is a metadata hash and a string with its bytes (see ``broker.keys``); its
memory cost in Redis is about its size. Uploads arrive and are written in
blocks, and content is read back in blocks (``GETRANGE``): no process holds a
whole file. Output files are written under a temporary key and renamed into
place, so writing one again (a finalize that was interrupted) replaces it whole.
An upload with an Idempotency-Key (``create_once``) stores its file in the transaction
that records the key's claim (``broker.idempotency``), so a retry gets the first file.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from broker import idempotency, keys
from broker.errors import NotFound
from broker.idempotency import Idempotency
from broker.redis import replies


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

    @classmethod
    def from_hash(cls, file_id: str, h: replies.Hash) -> FileRecord:
        return cls(
            id=file_id,
            owner=h[b"owner"].decode(),
            bytes=int(h[b"bytes"]),
            created_at=int(h[b"created_at"]),
            filename=h[b"filename"].decode(),
            purpose=h[b"purpose"].decode(),
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
            "expires_at": None,
        }


def _store(pipe: Pipeline, record: FileRecord) -> None:
    """Queue the commands that put an uploaded file (its temporary key) in place."""
    if record.bytes:
        pipe.rename(keys.file_tmp(record.id), keys.file_data(record.id))
    else:
        pipe.delete(keys.file_data(record.id))
    pipe.hset(
        keys.file_meta(record.id),
        mapping={
            "owner": record.owner,
            "bytes": record.bytes,
            "created_at": record.created_at,
            "filename": record.filename,
            "purpose": record.purpose,
        },
    )
    pipe.zadd(keys.owner_files(record.owner), {record.id: time.time_ns() // 1000})


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
        file_id: str | None = None,
    ) -> FileRecord:
        """Store a file from its blocks; replaces a file of the same id whole."""
        file_id = file_id or new_file_id()
        size = await self._upload(file_id, blocks)
        record = FileRecord(file_id, owner, size, int(time.time()), filename, purpose)
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
    ) -> tuple[FileRecord, bool]:
        """``create``, once per Idempotency-Key: (the file the key made, whether it was
        made now). IdempotencyKeyReused when the key is another upload's; a file the key
        made and that was deleted since is IdempotentResultGone, not made again."""
        made = await idempotency.made(self._redis, once)
        if made is None:  # most likely the first try: upload, then store it with the claim
            file_id = new_file_id()
            size = await self._upload(file_id, blocks)
            record = FileRecord(file_id, owner, size, int(time.time()), filename, purpose)
            made, created = await idempotency.create_once(
                self._redis, once, file_id, lambda pipe: _store(pipe, record)
            )
            if created:
                return record, True
            await self._redis.delete(keys.file_tmp(file_id))  # another try stored it first
        try:
            return await self.get(made, owner), False
        except NotFound:
            raise idempotency.object_gone("file", made) from None

    async def _upload(self, file_id: str, blocks: AsyncIterable[bytes]) -> int:
        """The file's bytes, appended to its temporary key; their count."""
        tmp = keys.file_tmp(file_id)
        await self._redis.delete(tmp)
        size = 0
        try:
            async for block in blocks:
                if block:
                    size = await self._redis.append(tmp, block)
        except BaseException:
            await self._redis.delete(tmp)
            raise
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
            await pipe.execute()
