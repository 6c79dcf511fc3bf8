"""The Python client: submit to fairq directly through Redis, no gateway in between.

``AsyncClient`` is the implementation; ``Client`` is a thin synchronous wrapper
that runs it on an event loop in a background thread (one implementation, no
drifting twin). The client acts as the holder of an API key: the key decides
the user, bands and models exactly as at the gateway.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from redis.asyncio import Redis

from broker.auth import KeyRing, Principal
from broker.deadlines import max_queue_s as checked_max_queue_s
from broker.deadlines import own_deadline_ms
from broker.engine_fields import check_fields
from broker.errors import JobFailed, UnknownModel
from broker.idempotency import Idempotency, fingerprint
from broker.jobs import JobRecord, JobState, RequestKind, Submission, new_job_id
from broker.position import QueuePosition
from broker.queue import JobQueue
from broker.redis.connect import connect, lean_link
from broker.requests import (
    check_body,
    engine_payload,
    estimate_cost,
    estimate_tokens,
    stream_mode,
)
from broker.result_readers import result_reader
from broker.results import ResultEvent
from broker.settings import Settings, load_settings
from broker.tiers import ServiceTiers, request_band

if TYPE_CHECKING:
    from broker.result_readers import ClusterResultReader
    from broker.results import ResultReader

T = TypeVar("T")


class AsyncClient:
    def __init__(self, settings: Settings | None = None, *, api_key: str) -> None:
        self._settings = settings or load_settings()
        self._principal: Principal = KeyRing(self._settings).resolve(api_key)
        self._tiers = ServiceTiers.of(self._settings)
        self._redis: Redis = connect(self._settings)
        self._link = lean_link(self._settings)  # enqueue.lua, as the gateway does
        self._queue = JobQueue(self._redis, self._settings, self._link)
        self._reader: ResultReader | ClusterResultReader | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._reader is not None:
            await self._reader.close()
        if self._link is not None:
            self._link.close()
        await self._redis.aclose()

    async def submit(
        self,
        model: str,
        *,
        band: str | None = None,
        idempotency_key: str | None = None,
        max_queue_s: float | None = None,
        **body: Any,
    ) -> str:
        """Queue a chat (``messages=``) or text completion (``prompt=``); returns the job id.
        ``band`` wins over a ``service_tier=`` in the body, as ``X-Fairq-Band`` at the gateway.
        ``idempotency_key``: as the gateway's ``Idempotency-Key`` (the same scope): the same
        request sent again with it returns the first try's job id, never a second job.
        ``max_queue_s``: as ``X-Fairq-Max-Queue-S``, the longest the job may wait queued
        before it ends expired (clamped to its band's deadline: ``broker.deadlines``)."""
        asked_s = None if max_queue_s is None else checked_max_queue_s(max_queue_s, "max_queue_s")
        config = self._settings.model(model)
        if config is None or not self._principal.may_use_model(model):
            raise UnknownModel(
                f"The model `{model}` does not exist or you do not have access to it."
            )
        kind = RequestKind.CHAT if "messages" in body else RequestKind.COMPLETION
        body = check_body(kind, {"model": model, **body})
        check_fields(kind, body, config)
        job_id = new_job_id(model)
        queued_in = request_band(self._principal, band, body.get("service_tier"), self._tiers)
        return await self._queue.submit(
            Submission(
                model=model,
                owner=self._principal.user,
                user=self._principal.end_user(body.get("user")),
                tenant=self._principal.tenant,
                band=queued_in,
                kind=kind,
                stream_flag=stream_mode(body, config, kind),
                payload=engine_payload(body, job_id, config, kind),
                job_id=job_id,
                cost=estimate_cost(body, config, kind),
                tokens=estimate_tokens(body, config, kind),
                weight=self._principal.weight,
                once=self._once(idempotency_key, kind, body, band),
                max_queue_ms=own_deadline_ms(asked_s, queued_in, self._settings.queue_deadline_s),
            )
        )

    def _once(
        self, key: str | None, kind: RequestKind, body: dict[str, Any], band: str | None
    ) -> Idempotency | None:
        """The submission's Idempotency-Key, fingerprinted as the gateway does a request
        (route, body, band), so a retry through either finds the other's job."""
        if key is None:
            return None
        return Idempotency.of(
            key,
            owner=self._principal.user,
            route=kind.value,
            fingerprint=fingerprint(kind.value, body, band),
            window_s=self._settings.idempotency_window_s,
        )

    async def status(self, job_id: str) -> JobRecord:
        return await self._queue.get(job_id, self._principal.user)

    async def position(self, job_id: str) -> QueuePosition | None:
        """Jobs ahead of a queued job and its estimated wait; None once it left the queue."""
        return await self._queue.position(await self.status(job_id))

    async def cancel(self, job_id: str) -> JobRecord:
        return await self._queue.cancel(job_id, self._principal.user)

    async def events(self, job_id: str) -> AsyncIterator[ResultEvent]:
        """The job's raw result events, resumable from the start, until its end."""
        job = await self.status(job_id)  # ownership check before reading anything
        if self._reader is None:
            self._reader = result_reader(self._settings, self._redis, 2.0, self._link)
            self._reader.start()
        async for event in self._reader.events(job.model, job_id):
            if event.end is not None and event.end is not JobState.COMPLETED:
                raise _failure(event)
            yield event

    async def stream(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed job, parsed, in order."""
        async for event in self.events(job_id):
            for raw in (event.chunk or b"").split(b"\n\n"):
                if raw.startswith(b"data: "):
                    yield orjson.loads(raw[6:])

    async def result(self, job_id: str) -> dict[str, Any]:
        """Wait for a non-streamed job and return the engine's response object."""
        body: dict[str, Any] = {}
        async for event in self.events(job_id):
            if event.body is not None:
                body = orjson.loads(event.body)
        return body


async def _next(chunks: AsyncIterator[T]) -> T:
    return await chunks.__anext__()


def _failure(event: ResultEvent) -> JobFailed:
    error = event.error or {}
    state = event.end.value if event.end else "failed"
    message = str(error.get("message") or f"the job ended {state}")
    status = error.get("status")
    return JobFailed(message, state=state, status=status if isinstance(status, int) else None)


class Client:
    """Synchronous wrapper: the same calls as ``AsyncClient``, blocking."""

    def __init__(self, settings: Settings | None = None, *, api_key: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._async = self._call(self._create(settings, api_key))

    @staticmethod
    async def _create(settings: Settings | None, api_key: str) -> AsyncClient:
        return AsyncClient(settings, api_key=api_key)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._call(self._async.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def submit(
        self,
        model: str,
        *,
        band: str | None = None,
        idempotency_key: str | None = None,
        max_queue_s: float | None = None,
        **body: Any,
    ) -> str:
        return self._call(
            self._async.submit(
                model,
                band=band,
                idempotency_key=idempotency_key,
                max_queue_s=max_queue_s,
                **body,
            )
        )

    def status(self, job_id: str) -> JobRecord:
        return self._call(self._async.status(job_id))

    def cancel(self, job_id: str) -> JobRecord:
        return self._call(self._async.cancel(job_id))

    def position(self, job_id: str) -> QueuePosition | None:
        return self._call(self._async.position(job_id))

    def result(self, job_id: str) -> dict[str, Any]:
        return self._call(self._async.result(job_id))

    def stream(self, job_id: str) -> Iterator[dict[str, Any]]:
        chunks = self._async.stream(job_id)
        while True:
            try:
                yield self._call(_next(chunks))
            except StopAsyncIteration:
                return
