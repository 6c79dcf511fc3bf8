"""Who may call ``fairq keda-scaler`` and what a refusal tells them: the servicer on a
real grpcio server (in this process, its board fed by hand), called by grpcio's client.

KEDA sends an external scaler no call metadata, so the caller is authenticated by mutual
TLS: a client certificate signed by the CA the scaler is given (``--tls-client-ca``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from scaler import ScalerOptions
from scaler.board import DemandBoard
from scaler.protocol import externalscaler_pb2 as pb
from scaler.protocol import externalscaler_pb2_grpc as pb_grpc
from scaler.server import DemandScaler
from tests.support.tlsproxy import make_certificates, make_stranger

MODELS = ["m1", "private-model-of-another-team"]


def ref(model: str, name: str = "engine-m1") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace="fairq", scalerMetadata={"model": model})


async def serving(options: ScalerOptions) -> tuple[aio.Server, str]:
    board = DemandBoard(MODELS, stale_after_s=60)
    board.update(dict.fromkeys(MODELS, 0), complete=True)
    server = aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(DemandScaler(board), server)
    credentials = options.credentials()
    if credentials is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def mutual(tmp_path: Path) -> AsyncIterator[tuple[str, tuple[Path, ...]]]:
    files = make_certificates(tmp_path, clients=1)
    ca, cert, key = files[:3]
    server, address = await serving(ScalerOptions(tls_cert=cert, tls_key=key, tls_client_ca=ca))
    yield address, files
    await server.stop(None)


async def is_active(address: str, credentials: grpc.ChannelCredentials, model: str = "m1"
                    ) -> bool:  # fmt: skip
    async with aio.secure_channel(address, credentials) as channel:
        answer = await pb_grpc.ExternalScalerStub(channel).IsActive(ref(model), timeout=5)
        return bool(answer.result)


async def test_over_tls_it_answers_a_client_whose_certificate_its_ca_signed(
    mutual: tuple[str, tuple[Path, ...]],
) -> None:
    address, (ca, _, _, client, client_key) = mutual
    keda = grpc.ssl_channel_credentials(ca.read_bytes(), client_key.read_bytes(),
                                        client.read_bytes())  # fmt: skip
    assert await is_active(address, keda) is False


async def test_a_client_without_a_certificate_or_with_a_strangers_is_refused(
    mutual: tuple[str, tuple[Path, ...]], tmp_path: Path
) -> None:
    address, (ca, *_) = mutual
    stranger, stranger_key = make_stranger(tmp_path)
    anonymous = grpc.ssl_channel_credentials(ca.read_bytes())
    impostor = grpc.ssl_channel_credentials(ca.read_bytes(), stranger_key.read_bytes(),
                                            stranger.read_bytes())  # fmt: skip
    for credentials in (anonymous, impostor):
        with pytest.raises(aio.AioRpcError) as refused:
            await is_active(address, credentials)
        # The handshake fails: no call is made, so KEDA sees the scaler as unreachable.
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    async with aio.insecure_channel(address) as plain:
        with pytest.raises(aio.AioRpcError) as refused:
            await pb_grpc.ExternalScalerStub(plain).IsActive(ref("m1"), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, "plaintext is not served"


async def test_an_unknown_model_is_refused_without_the_models_it_serves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, address = await serving(ScalerOptions())
    asked = "x" * 500
    try:
        async with aio.insecure_channel(address) as channel:
            with pytest.raises(aio.AioRpcError) as refused:
                await pb_grpc.ExternalScalerStub(channel).IsActive(ref(asked, "n" * 500))
    finally:
        await server.stop(None)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = refused.value.details() or ""
    assert "is not served by this scaler" in message
    assert not any(model in message for model in MODELS), message
    assert asked not in message and len(message) < 300, "what the caller sent is cut short"
    # The operator still learns what the scaler serves, from its log.
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("private-model-of-another-team" in line for line in logged), logged


def test_a_scaler_that_does_not_authenticate_its_callers_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    ca, cert, key = make_certificates(tmp_path)
    plaintext = ScalerOptions().exposure()
    assert plaintext is not None and "plaintext" in plaintext and "\n" not in plaintext
    assert "--tls-client-ca" in (ScalerOptions(tls_cert=cert, tls_key=key).exposure() or "")
    assert ScalerOptions(tls_cert=cert, tls_key=key, tls_client_ca=ca).exposure() is None


async def test_renewed_certificate_files_serve_new_connections_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # cert-manager renews a certificate's Secret in place: here, a new CA's files at once.
    caplog.set_level(logging.INFO, "scaler.tls")
    old, new, live = tmp_path / "old", tmp_path / "new", tmp_path / "live"
    for folder in (old, new, live):
        folder.mkdir()
    first, second = make_certificates(old, clients=1), make_certificates(new, clients=1)
    paths = [live / "ca.pem", live / "cert.pem", live / "key.pem"]
    for path, source in zip(paths, first[:3], strict=True):
        path.write_bytes(source.read_bytes())
    server, address = await serving(ScalerOptions(tls_cert=paths[1], tls_key=paths[2],
                                                  tls_client_ca=paths[0]))  # fmt: skip

    def keda(files: tuple[Path, ...]) -> grpc.ChannelCredentials:
        ca, _, _, client, client_key = files
        return grpc.ssl_channel_credentials(ca.read_bytes(), client_key.read_bytes(),
                                            client.read_bytes())  # fmt: skip

    try:
        assert await is_active(address, keda(first)) is False
        for path, source in zip(paths, second[:3], strict=True):
            path.write_bytes(source.read_bytes())
        assert await is_active(address, keda(second)) is False  # the renewed pair serves
        with pytest.raises(aio.AioRpcError) as refused:
            await is_active(address, keda(first))  # the old CA's client is not trusted now
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)
    assert any("renewed" in r.getMessage() for r in caplog.records)
