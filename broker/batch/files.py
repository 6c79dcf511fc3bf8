"""Files of the Batch API, stored in Redis so that every gateway replica reads them.

A file is a metadata hash and a string with its bytes (see ``broker.keys``); its
memory cost in Redis is about its size. Uploads arrive and are written in
blocks, and content is read back in blocks (``GETRANGE``): no process holds a
whole file. Output files are written under a temporary key and renamed into
place, so writing one again (a finalize that was interrupted) replaces it whole.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import cast

from redis.asyncio import Redis

from broker import keys
from broker.errors import NotFound
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
        record = FileRecord(file_id, owner, size, int(time.time()), filename, purpose)
        async with self._redis.pipeline(transaction=True) as pipe:
            if size:
                pipe.rename(tmp, keys.file_data(file_id))
            else:
                pipe.delete(keys.file_data(file_id))
            pipe.hset(
                keys.file_meta(file_id),
                mapping={
                    "owner": owner,
                    "bytes": size,
                    "created_at": record.created_at,
                    "filename": filename,
                    "purpose": purpose,
                },
            )
            pipe.zadd(keys.owner_files(owner), {file_id: time.time_ns() // 1000})
            await pipe.execute()
        return record

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
