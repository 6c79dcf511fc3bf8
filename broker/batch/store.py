"""Batches: the OpenAI batch object as a Redis hash, its status moves and its listing.

Status moves are one script (``batch_status.lua``) that checks the current status,
so a gateway's cancel and a batch worker's progress can never both win::

    validating ─┬─▶ in_progress ─▶ finalizing ─▶ completed
                └─▶ failed (the file is not JSONL at all, or has no valid line)
    validating / in_progress ─▶ cancelling ─▶ cancelled
    validating / in_progress ─(window passed: flag 'expiring')─▶ expired
    any of these ─(a step failed batch.step_max_tries times in a row)─▶ failed

The hash keeps OpenAI's field names and fairq's own beside them
(``broker.batch.batch_fields``: the key's entitlement, the ingest cursor, expiry, steps
failed in a row). A batch created with an Idempotency-Key
(``create_once``) is stored in the transaction that records the key's claim
(``broker.idempotency``), so a retry gets the first batch.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any, cast

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from broker import idempotency, keys, telemetry
from broker.auth import Principal
from broker.batch import batch_fields
from broker.batch.errors import NotCancellable
from broker.errors import NotFound
from broker.idempotency import Idempotency
from broker.lua.batch_lease import batch_lease_call
from broker.lua.batch_record import batch_record_call
from broker.lua.batch_status import batch_status_call
from broker.redis import replies

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


def _int(h: dict[bytes, bytes], field: str) -> int | None:
    value = h.get(field.encode())
    return int(value) if value else None


def _json(h: dict[bytes, bytes], field: str) -> Any:
    value = h.get(field.encode())
    return orjson.loads(value) if value else None


@dataclass(frozen=True)
class BatchRecord:
    id: str
    h: dict[bytes, bytes]

    def s(self, field: str) -> str | None:
        value = self.h.get(field.encode())
        return value.decode() if value else None

    def n(self, field: str) -> int:
        return _int(self.h, field) or 0

    @property
    def status(self) -> str:
        return self.s(batch_fields.STATUS) or ""

    @property
    def owner(self) -> str:
        return self.s(batch_fields.OWNER) or ""

    @property
    def models(self) -> tuple[str, ...] | None:
        value = _json(self.h, batch_fields.MODELS)
        return tuple(value) if value is not None else None

    def public(self) -> dict[str, object]:
        """OpenAI's batch object."""
        out: dict[str, object] = {
            "id": self.id,
            "object": "batch",
            "endpoint": self.s(batch_fields.ENDPOINT),
            "errors": _json(self.h, batch_fields.ERRORS),
            "input_file_id": self.s(batch_fields.INPUT_FILE_ID),
            "completion_window": self.s(batch_fields.COMPLETION_WINDOW),
            "status": self.status,
            "output_file_id": self.s(batch_fields.OUTPUT_FILE_ID),
            "error_file_id": self.s(batch_fields.ERROR_FILE_ID),
            "created_at": self.n(batch_fields.CREATED_AT),
            "expires_at": _int(self.h, batch_fields.EXPIRES_AT),
            "request_counts": {
                "total": self.n(batch_fields.TOTAL) or self.n(batch_fields.LINE),
                "completed": self.n(batch_fields.COMPLETED),
                "failed": self.n(batch_fields.FAILED),
            },
            "metadata": _json(self.h, batch_fields.METADATA),
            "model": self.s(batch_fields.MODEL),
        }
        out.update({field: _int(self.h, field) for field in batch_fields.TIMES})
        return out


def _fields(
    caller: Principal,
    *,
    input_file_id: str,
    endpoint: str,
    window: str,
    window_s: int,
    metadata: dict[str, str] | None,
) -> dict[str, str | int | bytes]:
    """A new batch's hash: status ``validating``, the caller's entitlement, no progress."""
    now = int(time.time())
    fields: dict[str, str | int | bytes] = {
        batch_fields.STATUS: "validating",
        batch_fields.ENDPOINT: endpoint,
        batch_fields.INPUT_FILE_ID: input_file_id,
        batch_fields.COMPLETION_WINDOW: window,
        batch_fields.CREATED_AT: now,
        batch_fields.EXPIRES_AT: now + window_s,
        batch_fields.OWNER: caller.user,
        batch_fields.TENANT: caller.tenant,
        batch_fields.WEIGHT: str(caller.weight),
        batch_fields.MODELS: orjson.dumps(caller.models),
        batch_fields.OFFSET: 0,
        batch_fields.LINE: 0,
        batch_fields.QUEUED: 0,
        batch_fields.COMPLETED: 0,
        batch_fields.FAILED: 0,
    }
    if metadata:
        fields[batch_fields.METADATA] = orjson.dumps(metadata)
    return fields


def _store(pipe: Pipeline, batch_id: str, owner: str, fields: dict[str, str | int | bytes]) -> None:
    """Queue the commands that store a new batch, listed for its owner and the workers."""
    pipe.hset(keys.batch(batch_id), mapping=fields)  # type: ignore[arg-type]
    pipe.zadd(keys.owner_batches(owner), {batch_id: time.time_ns() // 1000})
    pipe.sadd(keys.ACTIVE_BATCHES, batch_id)


class BatchStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def create(
        self,
        caller: Principal,
        *,
        input_file_id: str,
        endpoint: str,
        window: str,
        window_s: int,
        metadata: dict[str, str] | None,
    ) -> BatchRecord:
        """A new batch, status ``validating``."""
        batch_id = new_batch_id()
        fields = _fields(
            caller,
            input_file_id=input_file_id,
            endpoint=endpoint,
            window=window,
            window_s=window_s,
            metadata=metadata,
        )
        async with self._redis.pipeline(transaction=False) as pipe:
            _store(pipe, batch_id, caller.user, fields)
            await pipe.execute()
        return await self.get(batch_id, caller.user)

    async def create_once(
        self,
        once: Idempotency,
        caller: Principal,
        *,
        input_file_id: str,
        endpoint: str,
        window: str,
        window_s: int,
        metadata: dict[str, str] | None,
    ) -> tuple[BatchRecord, bool]:
        """``create``, once per Idempotency-Key: (the batch the key made, whether it was
        made now). IdempotencyKeyReused when the key is another request's."""
        batch_id = new_batch_id()
        fields = _fields(
            caller,
            input_file_id=input_file_id,
            endpoint=endpoint,
            window=window,
            window_s=window_s,
            metadata=metadata,
        )
        made, created = await idempotency.create_once(
            self._redis, once, batch_id, lambda pipe: _store(pipe, batch_id, caller.user, fields)
        )
        try:
            return await self.get(made, caller.user), created
        except NotFound:
            raise idempotency.object_gone("batch", made) from None

    async def get(self, batch_id: str, owner: str | None) -> BatchRecord:
        """The batch; NotFound if there is none or it is someone else's (``owner=None``: any)."""
        h = replies.hash_reply(await self._redis.hgetall(keys.batch(batch_id)))
        if not h or (
            owner is not None and h.get(batch_fields.OWNER.encode(), b"").decode() != owner
        ):
            raise NotFound(f"No such Batch object: {batch_id}", code="batch_not_found")
        return BatchRecord(batch_id, h)

    async def list(
        self, owner: str, limit: int, after: str | None
    ) -> tuple[list[BatchRecord], bool]:
        """A page of the owner's batches, newest first, and whether more follow."""
        start = 0
        if after is not None:
            rank = cast(int | None, await self._redis.zrevrank(keys.owner_batches(owner), after))
            start = 0 if rank is None else int(rank) + 1
        ids = replies.members(
            await self._redis.zrevrange(keys.owner_batches(owner), start, start + limit)
        )
        records = [await self.get(i.decode(), owner) for i in ids[:limit]]
        return records, len(ids) > limit

    async def move(
        self,
        batch_id: str,
        to: str,
        allowed: tuple[str, ...],
        stamp: str = "",
        **fields: str | int | bytes,
    ) -> tuple[bool, str]:
        """Move the batch to ``to`` if its status is one of ``allowed``: (moved, old status)."""
        call = batch_status_call(batch_id, to, allowed, stamp, fields)
        moved, status = await call.run(self._redis)
        if moved and to in TERMINAL:
            telemetry.batch_ended(to)
        return moved, status

    async def step_failed(self, batch_id: str, error: str) -> int:
        """Count a failed step of the batch and keep its error; returns the failures in a
        row (two fields, however many: the count and the last error)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(keys.batch(batch_id), batch_fields.STEP_FAILS, 1)
            pipe.hset(keys.batch(batch_id), batch_fields.STEP_ERROR, error)
            fails, _ = await pipe.execute()
        return int(fails)

    async def step_succeeded(self, batch_id: str) -> None:
        """A step went through: the next failure is the first in a row again."""
        await self._redis.hdel(
            keys.batch(batch_id), batch_fields.STEP_FAILS, batch_fields.STEP_ERROR
        )

    async def cancel(self, batch_id: str, owner: str) -> BatchRecord:
        """Start cancelling (the batch workers finish it); NotCancellable once it is ending."""
        await self.get(batch_id, owner)
        moved, status = await self.move(
            batch_id, "cancelling", ("validating", "in_progress"), batch_fields.CANCELLING_AT
        )
        if not moved and status != "cancelling":
            raise NotCancellable(f"Cannot cancel a batch with status '{status}'.")
        return await self.get(batch_id, owner)

    async def hold_lease(self, batch_id: str, token: str, lease_ms: int) -> bool:
        """Renew the batch's lease for ``lease_ms`` (0: release it) if ``token`` holds it;
        whether it does (did)."""
        return await batch_lease_call(batch_id, token, lease_ms).run(self._redis)

    # ``batch_record.lua``'s call: how a line ended, recorded once (steps pipeline many).
    record_call = staticmethod(batch_record_call)
