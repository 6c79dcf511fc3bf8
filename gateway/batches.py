"""The Batch API: ``/v1/batches`` (create, retrieve, list, cancel), OpenAI's shapes.

Creating a batch only records it (status ``validating``); the batch workers
(RQ, ``batch.jobs``) read the file, run its lines in band ``batch`` and
write the output and error files. The key must be entitled to band ``batch``. A
create with an ``Idempotency-Key`` makes its batch once per key (its fingerprint: the
body); a retry gets the first try's batch as it is now (``Idempotent-Replayed: true``).

A batch keeps its input file, however early it was to expire, until the batch's window
and ``batch.line_keep_s`` (the batch-worker outage a batch survives) have passed: the
ingest reads it a block at a time for as long as the batch is validating, and a file
gone mid-read would end the batch's lines early. The file's ``expires_at`` shows that.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from broker import idempotency
from broker.auth import Principal
from broker.batch import KINDS, BatchRecord, BatchStore, FileStore
from broker.errors import InvalidRequest
from broker.requests import parse_json
from gateway.auth import Caller
from gateway.body import read_body
from gateway.errors import json_response, list_response
from gateway.idempotency import idempotency_key, replay_headers, scoped
from gateway.state import gateway_of

_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = METADATA_LIMITS = 16, 64, 512

router = APIRouter()


def _store(request: Request) -> BatchStore:
    return BatchStore(gateway_of(request).redis)


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > _METADATA_PAIRS
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= _METADATA_KEY
            and len(v) <= _METADATA_VALUE
            for k, v in value.items()
        )
    ):
        raise InvalidRequest(
            f"metadata must be an object of at most {_METADATA_PAIRS} string pairs "
            f"(keys up to {_METADATA_KEY} characters, values up to {_METADATA_VALUE})",
            param="metadata",
        )
    return value


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"'{name}' is required (a string)", param=name)
    return value


@router.post("/v1/batches")
async def create_batch(request: Request, caller: Caller) -> Response:
    gateway = gateway_of(request)
    key = idempotency_key(request)
    body = parse_json(await read_body(request, gateway.settings.max_body_bytes))
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    caller.band_for("batch", gateway.settings.bands)  # unless the key may use band batch
    endpoint, window = _field(body, "endpoint"), _field(body, "completion_window")
    if endpoint not in KINDS:
        raise InvalidRequest(
            f"endpoint must be one of {', '.join(KINDS)}, not {endpoint!r}", param="endpoint"
        )
    windows = gateway.settings.batch.completion_windows
    if window not in windows:
        raise InvalidRequest(
            f"completion_window must be one of {', '.join(windows)}", param="completion_window"
        )
    metadata = _metadata(body.get("metadata"))
    file = await FileStore(gateway.redis).get(_field(body, "input_file_id"), caller.user)
    if file.purpose != "batch":
        raise InvalidRequest(
            f"file {file.id} has purpose {file.purpose!r}, not 'batch'", param="input_file_id"
        )
    # Before the batch exists, so no batch worker reads a file that may expire under it.
    reading_until = int(time.time()) + windows[window] + gateway.settings.batch.line_keep_s
    file = await FileStore(gateway.redis).keep_until(file, reading_until)
    batch, replayed = await _create(
        request,
        caller,
        key,
        body,
        input_file_id=file.id,
        endpoint=endpoint,
        window=window,
        window_s=windows[window],
        metadata=metadata,
    )
    return json_response(batch.public(), headers=replay_headers(replayed))


async def _create(
    request: Request, caller: Principal, key: str | None, body: dict[str, Any], **fields: Any
) -> tuple[BatchRecord, bool]:
    """The batch, and whether it is an earlier try's (with an Idempotency-Key)."""
    store = _store(request)
    if key is None:
        return await store.create(caller, **fields), False
    once = scoped(request, caller, key, "batches", idempotency.fingerprint("batches", body))
    batch, created = await store.create_once(once, caller, **fields)
    return batch, not created


@router.get("/v1/batches")
async def list_batches(
    request: Request,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> Response:
    records, more = await _store(request).list(caller.user, limit, after)
    return list_response([r.public() for r in records], more)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(request: Request, caller: Caller, batch_id: str) -> Response:
    return json_response((await _store(request).get(batch_id, caller.user)).public())


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: Request, caller: Caller, batch_id: str) -> Response:
    return json_response((await _store(request).cancel(batch_id, caller.user)).public())
