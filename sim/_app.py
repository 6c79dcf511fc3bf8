"""The simulator's HTTP surface: vLLM's OpenAI-compatible routes over one engine.

`create_app` wires one profile, one engine loop (started and stopped by the
app's lifespan) and one private metrics registry per app, so several simulated
pods can run in one process.

``startup_s`` makes the pod take that long to start, as a vLLM pod loading its weights:
from the lifespan's start until then every route answers 503 (``/health`` included, so
a readiness probe and fairq's scraper see a pod that is not ready yet), then it serves.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sim._embeddings import EmbeddingJson, parse_embedding
from sim._engine import Engine, engine_running
from sim._errors import EngineStopped, RequestError
from sim._faults import FaultBook
from sim._metrics import CONTENT_TYPE_LATEST, SimMetrics
from sim._parsing import GenRequest, parse_request
from sim._profile import SimProfile
from sim._responses import JsonCompletionResponse, SseResponse
from sim._responses_api import ResponsesJson, ResponsesSse, parse_responses
from sim._tokens import anchor_of, answer_seed, prompt_ids
from sim._wire import (
    VLLM_VERSION,
    ResponseMeta,
    error_body,
    models_body,
    server_info_body,
)

log = logging.getLogger(__name__)


def create_app(models: list[str], profile: SimProfile, *, startup_s: float = 0.0) -> FastAPI:
    """An ASGI app that serves `models` from one simulated engine.

    The engine loop runs inside the app's lifespan, so the ASGI server must run
    lifespan events (uvicorn does by default); without it, requests get 503.
    ``startup_s`` (module docstring): seconds of 503 on every route after that start.
    """
    if not models:
        raise ValueError("the engine simulator needs at least one model name")
    if not startup_s >= 0:  # also NaN
        raise ValueError(f"startup_s must be 0 or more seconds, not {startup_s}")
    routes = _Routes(list(models), profile)
    starting = _Starting(startup_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with engine_running(routes.engine):
            starting.begin()
            yield

    app = FastAPI(
        title="fairq engine simulator",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.sim_engine = routes.engine  # for serve(): abort open requests on a signal
    # Plain Starlette routes: the handlers read raw bytes, no validation layer per request.
    app.add_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    app.add_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_route("/v1/responses", routes.responses, methods=["POST"])
    if profile.embeddings:
        app.add_route("/v1/embeddings", routes.embeddings, methods=["POST"])
    app.add_route("/v1/models", routes.list_models, methods=["GET"])
    app.add_route("/health", routes.health, methods=["GET"])
    app.add_route("/metrics", routes.metrics, methods=["GET"])
    if profile.dev_mode:
        app.add_route("/server_info", routes.server_info, methods=["GET"])
    if startup_s > 0:
        app.add_middleware(_RefuseWhileStarting, starting=starting)
    return app


class _Starting:
    """Whether the pod is still starting: ``startup_s`` from ``begin`` (the lifespan's
    start); before ``begin`` it is starting too."""

    def __init__(self, startup_s: float) -> None:
        self._startup_s = startup_s
        self._ready_at: float | None = None

    def begin(self) -> None:
        self._ready_at = time.monotonic() + self._startup_s
        if self._startup_s > 0:
            log.info("simulating a start-up: not ready for %.1f s", self._startup_s)

    def still(self) -> bool:
        if self._ready_at is None:
            return True
        if time.monotonic() < self._ready_at:
            return True
        self._ready_at = -1.0  # ready for good: later calls compare once and return
        return False


class _RefuseWhileStarting:
    """503 to every HTTP request while the pod starts (a pure ASGI middleware: one
    comparison per request once it is ready)."""

    def __init__(self, app: ASGIApp, starting: _Starting) -> None:
        self._app = app
        self._starting = starting

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._starting.still():
            message = "the engine is starting (loading its weights); retry shortly"
            await _error(503, "ServiceUnavailableError", message)(scope, receive, send)
            return
        await self._app(scope, receive, send)


class _Routes:
    def __init__(self, models: list[str], profile: SimProfile) -> None:
        self.models = models
        self.profile = profile
        self.created = int(time.time())
        self.registry = SimMetrics(models)
        self.engine = Engine(profile, self.registry)
        self.registry.watch(self.engine)
        digest = hashlib.sha256(",".join(models).encode()).hexdigest()[:8]
        self.fingerprint = f"vllm-{VLLM_VERSION}-{digest}"
        self.faults = FaultBook()

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def embeddings(self, request: Request) -> Response:
        """One prefill per request, its vectors from its inputs (``_embeddings``)."""
        try:
            req = parse_embedding(await request.body(), self.models)
            seq = self.engine.submit(req.model, req.prompt_tokens, 1, "stop", streamed=False)
        except RequestError as exc:
            return _error(exc.status, exc.error_type, exc.message, exc.param)
        except EngineStopped as exc:
            return _error(503, "ServiceUnavailableError", str(exc))
        meta = ResponseMeta(req.request_id or "", int(time.time()), req.model, 0,
                            req.prompt_tokens, "stop", self.fingerprint)  # fmt: skip
        return EmbeddingJson(self.engine, seq, meta, req)

    async def responses(self, request: Request) -> Response:
        """The Responses API: a chat generation in its shape (``_responses_api``)."""
        try:
            req = parse_responses(await request.body(), self.models, self.profile)
            seq = self.engine.submit(
                req.model, req.prompt_tokens, req.max_tokens, req.finish_reason,
                priority=req.priority, streamed=req.stream, prefix_blocks=req.prefix_blocks,
            )  # fmt: skip
        except RequestError as exc:
            return _error(exc.status, exc.error_type, exc.message, exc.param)
        except EngineStopped as exc:
            return _error(503, "ServiceUnavailableError", str(exc))
        meta = self._meta(req)
        if req.stream:
            return ResponsesSse(self.engine, seq, meta, req)
        return ResponsesJson(self.engine, seq, meta, req)

    async def list_models(self, _: Request) -> Response:
        body = models_body(self.models, self.created, self.profile.max_model_len)
        return Response(body, media_type="application/json")

    async def server_info(self, request: Request) -> Response:
        profile = self.profile
        config = {
            "model_config": {
                "served_model_name": self.models[0],
                "max_model_len": profile.max_model_len,
            },
            "scheduler_config": {
                "policy": profile.scheduling_policy,
                "max_num_seqs": profile.max_num_seqs,
                "max_num_batched_tokens": profile.max_num_batched_tokens,
            },
        }
        as_json = request.query_params.get("config_format") == "json"
        body = server_info_body(config, as_json=as_json)
        return Response(body, media_type="application/json")

    async def health(self, _: Request) -> Response:
        # As vLLM: healthy while the engine loop is alive.
        return Response(status_code=200 if self.engine.accepting else 503)

    async def metrics(self, _: Request) -> Response:
        return Response(self.registry.render(), media_type=CONTENT_TYPE_LATEST)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        try:
            req = parse_request(
                await request.body(), chat=chat, models=self.models, profile=self.profile
            )
            fault = self.faults.active(req.fault, req.id)
            if fault is not None and fault.kind == "status":
                return _error(fault.status, "InternalServerError", fault.message)
            seq = self.engine.submit(
                req.model,
                req.prompt_tokens,
                req.max_tokens,
                req.finish_reason,
                priority=req.priority,
                streamed=req.stream,
                prefix_blocks=req.prefix_blocks,
            )
        except RequestError as exc:
            return _error(exc.status, exc.error_type, exc.message, exc.param)
        except EngineStopped as exc:
            return _error(503, "ServiceUnavailableError", str(exc))
        meta = self._meta(req)
        if req.stream:
            return SseResponse(
                self.engine, seq, meta, chat=chat, include_usage=req.include_usage, fault=fault
            )
        return JsonCompletionResponse(self.engine, seq, meta, chat=chat, fault=fault)

    def _meta(self, req: GenRequest) -> ResponseMeta:
        return response_meta(req, int(time.time()), self.fingerprint)


def response_meta(req: GenRequest, created: int, fingerprint: str) -> ResponseMeta:
    """What the request's chunks repeat. Its answer follows from the prompt's token ids
    (same id, same text; an answer's prompt plus its first tokens, its rest: ``_tokens``)."""
    if req.prompt_ids is not None:
        ids = list(req.prompt_ids)
    else:
        ids = prompt_ids(anchor_of(req.id), req.prompt_tokens)
    return ResponseMeta(
        id=req.id,
        created=created,
        model=req.model,
        seed=answer_seed(ids[0], len(ids)),
        prompt_tokens=req.prompt_tokens,
        finish_reason=req.finish_reason,
        fingerprint=fingerprint,
        prompt_ids=ids if req.return_token_ids else None,
    )


def _error(status: int, error_type: str, message: str, param: str | None = None) -> Response:
    body = error_body(status, error_type, message, param)
    return Response(body, status_code=status, media_type="application/json")
