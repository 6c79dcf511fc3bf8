"""The Files API: ``/v1/files`` (upload, list, retrieve, content, delete), OpenAI's shapes.

Uploads are ``multipart/form-data`` with ``purpose=batch`` and a ``file`` part.
The multipart parser spools the file part to a temporary file past 1 MB, and the
request is cut off with a 413 as soon as more than ``batch.max_file_bytes`` (plus
the multipart framing) has arrived, so no upload is held in memory or grows a
spool without bound. The file is then copied to Redis a block at a time.

An upload with an ``Idempotency-Key`` stores its file once per key: its fingerprint is
its purpose, its file name and its bytes (read from the spool, block by block, before
anything reaches Redis), and a retry gets the first upload's file object
(``Idempotent-Replayed: true``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response, StreamingResponse
from starlette.types import Message

from broker.auth import Principal
from broker.batch import FileRecord, FileStore, Quota, expires_in_s
from broker.errors import BodyTooLarge, Forbidden, InvalidRequest
from broker.idempotency import Fingerprint
from gateway.auth import Caller
from gateway.errors import json_response, list_response
from gateway.idempotency import idempotency_key, replay_headers, scoped
from gateway.state import gateway_of

_FRAMING_BYTES = 64 * 1024  # multipart boundaries and the other fields
_BLOCK = 1 << 20
_PURPOSES = ("batch",)

router = APIRouter()


def _store(request: Request) -> FileStore:
    return FileStore(gateway_of(request).redis, _BLOCK)


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(
        f"the file is larger than the limit of {limit} bytes ({limit / 2**20:.0f} MB); "
        "split it into smaller batch files (the limit is FAIRQ_BATCH__MAX_FILE_BYTES)"
    )


def _bounded(request: Request, limit: int) -> Request:
    """The request, with a receive channel that raises BodyTooLarge past ``limit``."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + _FRAMING_BYTES:
        raise _too_large(limit)
    seen = 0

    async def receive() -> Message:
        nonlocal seen
        message = await request.receive()
        seen += len(message.get("body", b""))
        if seen > limit + _FRAMING_BYTES:
            raise _too_large(limit)
        return message

    return Request(request.scope, receive)


async def _blocks(upload: UploadFile) -> AsyncIterator[bytes]:
    while block := await upload.read(_BLOCK):
        yield block


async def _fingerprint(purpose: str, filename: str, upload: UploadFile) -> str:
    """An upload's fingerprint: what it names and its bytes, read from the spool (which is
    rewound for the upload itself)."""
    found = Fingerprint("files", purpose, filename)
    async for block in _blocks(upload):
        found.add(block)
    await upload.seek(0)
    return found.hexdigest()


def _may_upload(request: Request, caller: Principal) -> None:
    """Forbidden unless the key may run batches: files are batch input only."""
    bands = gateway_of(request).settings.bands
    try:
        caller.band_for("batch", bands)
    except (Forbidden, InvalidRequest):
        raise Forbidden(
            "this API key may not upload files: uploads are batch input, and the key may not "
            f"use priority band 'batch' (allowed: {', '.join(caller.bands)}); ask the "
            "operator for a key with band 'batch'"
        ) from None


async def _store_upload(
    request: Request,
    caller: Principal,
    key: str | None,
    purpose: str,
    upload: UploadFile,
    *,
    keep_s: int,
) -> tuple[FileRecord, bool]:
    """The stored file, and whether it is an earlier try's (with an Idempotency-Key)."""
    store, filename = _store(request), upload.filename or "upload.jsonl"
    batch = gateway_of(request).settings.batch
    quota, size = Quota(batch.owner_max_bytes, batch.owner_max_files), upload.size
    if key is None:
        record = await store.create(
            caller.user, filename, purpose, _blocks(upload), keep_s=keep_s, size=size, quota=quota
        )
        return record, False
    once = scoped(request, caller, key, "files", await _fingerprint(purpose, filename, upload))
    record, created = await store.create_once(
        once, caller.user, filename, purpose, _blocks(upload), keep_s=keep_s, size=size, quota=quota
    )
    return record, not created


@router.post("/v1/files")
async def upload_file(request: Request, caller: Caller) -> Response:
    _may_upload(request, caller)
    batch = gateway_of(request).settings.batch
    limit = batch.max_file_bytes
    key = idempotency_key(request)
    form = await _bounded(request, limit).form(max_files=1, max_fields=8)
    try:
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose not in _PURPOSES:
            raise InvalidRequest(
                f"purpose must be one of {', '.join(_PURPOSES)} (fairq stores batch input files)",
                param="purpose",
            )
        if not isinstance(upload, UploadFile):
            raise InvalidRequest(
                "the upload has no 'file' part (multipart/form-data)", param="file"
            )
        if upload.size is not None and upload.size > limit:
            raise _too_large(limit)
        keep_s = expires_in_s(
            form.get("expires_after[anchor]"), form.get("expires_after[seconds]"), batch.file_keep_s
        )
        record, replayed = await _store_upload(
            request, caller, key, str(purpose), upload, keep_s=keep_s
        )
    finally:
        await form.close()
    return json_response(record.public(), headers=replay_headers(replayed))


@router.get("/v1/files")
async def list_files(
    request: Request,
    caller: Caller,
    *,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    after: str | None = None,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> Response:
    records, more = await _store(request).list(
        caller.user, limit, after, purpose, newest_first=order == "desc"
    )
    return list_response([r.public() for r in records], more)


@router.get("/v1/files/{file_id}")
async def retrieve_file(request: Request, caller: Caller, file_id: str) -> Response:
    return json_response((await _store(request).get(file_id, caller.user)).public())


@router.get("/v1/files/{file_id}/content")
async def file_content(request: Request, caller: Caller, file_id: str) -> Response:
    store = _store(request)
    record = await store.get(file_id, caller.user)
    headers = {"Content-Length": str(record.bytes)}
    return StreamingResponse(
        store.blocks(file_id), headers=headers, media_type="application/octet-stream"
    )


@router.delete("/v1/files/{file_id}")
async def delete_file(request: Request, caller: Caller, file_id: str) -> Response:
    await _store(request).delete(file_id, caller.user)
    return json_response({"id": file_id, "object": "file", "deleted": True})
