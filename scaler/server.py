"""``fairq keda-scaler``: KEDA's external-push scaler for fairq's demand, over gRPC.

KEDA (its ``external-push`` trigger, ``scalerAddress`` in the trigger's metadata) calls:

    IsActive        whether the model has demand (queued in any band, or in flight)
    StreamIsActive  the same, sent when the stream opens and again whenever it flips:
                    the first job of a model at zero wakes KEDA at once, not at its
                    next poll; and the model's last job ending says "inactive"
    GetMetricSpec   one metric, ``fairq-demand``, with the trigger's demand per replica
                    as its target (KEDA's HPA: replicas = ceil(demand / target))
    GetMetrics      the model's demand now

The answers come from the board (``scaler.board``) that ``DemandWatch`` keeps
fresh from Redis; an RPC never touches Redis. A trigger naming no model, or one this
scaler's configuration does not serve, is refused (INVALID_ARGUMENT, saying what to
fix); a board too old to trust (Redis unreachable) answers UNAVAILABLE, which KEDA
treats as a scaler error and keeps the replicas it has. StreamMetricSpec is left
unimplemented: KEDA falls back to GetMetricSpec (the target never changes at run time).
A refusal names only what the trigger sent (cut short); the models served go to the log.

Who may call: KEDA's external scaler sends no gRPC call metadata (no bearer token; its
``external_scaler.go`` takes only ``caCert``, ``tlsClientCert`` and ``tlsClientKey`` from a
TriggerAuthentication, for the channel), so the caller is authenticated by mutual TLS:
given ``tls_client_ca``, a client without a certificate that CA signed fails the handshake
and never reaches a call. Renewed certificate files are used for new connections without a
restart (``scaler.tls``). Without a certificate the scaler serves plaintext (local
use), and says so in one warning line at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from broker import Settings, connect, telemetry
from scaler.board import DemandBoard, Stale
from scaler.protocol import externalscaler_pb2 as pb
from scaler.protocol import externalscaler_pb2_grpc as pb_grpc
from scaler.target import METRIC, BadTrigger, Target, shown, target_of
from scaler.tls import CertFiles, TlsFileError
from scaler.watch import DemandWatch

log = logging.getLogger(__name__)

PORT = 9467
_STOP_GRACE_S = 2.0  # open streams end at once (the board closes); calls in progress get this


class ScalerError(RuntimeError):
    """The scaler cannot start (its port, its TLS files)."""


@dataclass(frozen=True)
class ScalerOptions:
    host: str = "127.0.0.1"
    port: int = PORT
    poll_s: float = 2.0  # every model's demand is read at least this often
    tls_cert: Path | None = None  # serve TLS with this certificate chain and key (PEM)
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # and ask KEDA for a client certificate signed by it

    def credentials(self) -> Any:
        """The server's TLS credentials, or None for plaintext."""
        if self.tls_cert is None and self.tls_key is None:
            if self.tls_client_ca is not None:
                raise ScalerError("--tls-client-ca needs --tls-cert and --tls-key")
            return None
        if self.tls_cert is None or self.tls_key is None:
            raise ScalerError("TLS needs both --tls-cert and --tls-key")
        try:
            return CertFiles(self.tls_key, self.tls_cert, self.tls_client_ca).credentials()
        except TlsFileError as exc:
            raise ScalerError(str(exc)) from exc

    def exposure(self) -> str | None:
        """The warning for a scaler that does not authenticate its callers, or None."""
        if self.tls_cert is None:
            return (
                "keda scaler: plaintext gRPC, callers not authenticated (local use only; "
                "give --tls-cert, --tls-key and --tls-client-ca)"
            )
        if self.tls_client_ca is None:
            return "keda scaler: TLS without --tls-client-ca: any client may call"
        return None


class DemandScaler(pb_grpc.ExternalScalerServicer):
    """The four calls of KEDA's ExternalScaler, on the board's demand."""

    def __init__(self, board: DemandBoard) -> None:
        self._board = board

    async def IsActive(self, request: pb.ScaledObjectRef, context: Any) -> pb.IsActiveResponse:
        target = await _target(request, self._board, context)
        return pb.IsActiveResponse(result=await _demand(target, self._board, context) > 0)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: Any
    ) -> AsyncIterator[pb.IsActiveResponse]:
        target = await _target(request, self._board, context)
        listener = self._board.listen(target.model)
        closed = asyncio.ensure_future(self._board.closed.wait())
        sent: bool | None = None
        try:
            while not self._board.closed.is_set():
                changed = asyncio.ensure_future(listener.changed.wait())
                await asyncio.wait([changed, closed], return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                listener.changed.clear()
                try:
                    active = self._board.demand(target.model) > 0
                except Stale:
                    continue  # the next fresh read tells the stream
                if active != sent:
                    sent = active
                    telemetry.KEDA_PUSHES.labels(target.model, str(active).lower()).inc()
                    yield pb.IsActiveResponse(result=active)
        finally:
            closed.cancel()
            self._board.forget(listener)

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: Any
    ) -> pb.GetMetricSpecResponse:
        target = await _target(request, self._board, context)
        spec = pb.MetricSpec(metricName=METRIC, targetSizeFloat=target.demand_per_replica)
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: Any
    ) -> pb.GetMetricsResponse:
        target = await _target(request.scaledObjectRef, self._board, context)
        demand = await _demand(target, self._board, context)
        value = pb.MetricValue(metricName=METRIC, metricValue=demand, metricValueFloat=demand)
        return pb.GetMetricsResponse(metricValues=[value])


async def _target(request: pb.ScaledObjectRef, board: DemandBoard, context: Any) -> Target:
    try:
        return target_of(dict(request.scalerMetadata), board.models)
    except BadTrigger as exc:
        log.warning(
            "refused a trigger of %s: %s (this scaler serves: %s)",
            shown(request.name), exc, ", ".join(board.models),
        )  # fmt: skip
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{shown(request.name)}: {exc}")
        raise  # abort raises; this line only tells the type checker so


async def _demand(target: Target, board: DemandBoard, context: Any) -> int:
    try:
        return board.demand(target.model)
    except Stale as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise


async def serve(settings: Settings, options: ScalerOptions, stop: asyncio.Event) -> None:
    """Answer KEDA on ``options.host:port`` for every configured model until ``stop``."""
    credentials = options.credentials()
    if (warning := options.exposure()) is not None:
        log.warning(warning)
    models = [m.name for m in settings.models]
    board = DemandBoard(models, stale_after_s=max(5.0, 3 * options.poll_s))
    # No SO_REUSEPORT (gRPC's default on Linux): a second scaler on a taken port fails to
    # start, rather than share the port and split KEDA's calls between two processes.
    server = aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_ExternalScalerServicer_to_server(DemandScaler(board), server)
    address = f"{options.host}:{options.port}"
    try:
        if credentials is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpc's "Failed to bind": taken, or not an address here
        raise ScalerError(f"cannot listen on {address} ({exc}); is the port taken?") from exc
    redis = connect(settings)
    try:
        await server.start()
        telemetry.serve_metrics(settings, "keda scaler")
        log.info(
            "keda scaler on %s (%s) for models: %s",
            address, "TLS" if credentials else "plaintext", ", ".join(models),
        )  # fmt: skip
        await DemandWatch(redis, board, options.poll_s).run(stop)
    finally:
        board.closed.set()
        await server.stop(_STOP_GRACE_S)
        await redis.aclose()
