"""``fairq keda-scaler`` with real parts: the process, a real Redis, fairq's own client
enqueueing and cancelling, and a real gRPC client (grpcio, KEDA's generated stubs) in the
place of KEDA.

A model with nothing queued is inactive; a job enqueued is pushed on the open
StreamIsActive stream within ``PUSH_BOUND_S`` (the enqueue's wake message, not a poll:
the poll is set far longer); GetMetrics says the demand and GetMetricSpec the trigger's
target; the job ending (cancelled, or served to its end by a simulated engine through a
real dispatcher and worker) pushes inactive; SIGTERM ends the stream and the process
cleanly. A taken port, bad TLS options and TLS itself are checked on the command too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc import aio

from broker import AsyncClient, JobState
from fairq.stack.localredis import free_port
from scaler.protocol import externalscaler_pb2 as pb
from scaler.protocol import externalscaler_pb2_grpc as pb_grpc
from tests.support.cli import fairq
from tests.support.eventually import aeventually
from tests.support.processes import ProcessGroups
from tests.support.settings import ALICE_KEY, MODEL, make_config, make_settings
from tests.support.stack import components, sim
from tests.support.tlsproxy import make_certificates

pytestmark = pytest.mark.integration

POLL_S = 30.0  # the scaler's backstop poll: far longer than any wait below
PUSH_BOUND_S = 0.1  # enqueue -> active=true on the stream
REF = pb.ScaledObjectRef(
    name="engine-m1", namespace="fairq", scalerMetadata={"model": MODEL, "demandPerReplica": "4"}
)


async def started_scaler(
    processes: ProcessGroups,
    redis_url: str,
    folder: Path,
    *options: str,
    credentials: grpc.ChannelCredentials | None = None,
    config: dict[str, Any] | None = None,
) -> tuple[subprocess.Popen[Any], aio.Channel, str]:
    config = config or make_config()
    (folder / "fairq.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    env = {**os.environ, "FAIRQ_CONFIG": str(folder / "fairq.yaml"), "FAIRQ_REDIS_URL": redis_url,
           "FAIRQ_METRICS_PORT": "0", "FAIRQ_LOG_LEVEL": "WARNING"}  # fmt: skip
    command = ["keda-scaler", "--port", str(port), "--poll-s", str(POLL_S), *options]
    proc = processes.start([sys.executable, "-m", "fairq", *command], env=env)
    address = f"127.0.0.1:{port}"
    if credentials is None:
        channel = aio.insecure_channel(address)
    else:
        channel = aio.secure_channel(address, credentials)
    stub = pb_grpc.ExternalScalerStub(channel)

    async def answers() -> bool:
        assert proc.poll() is None, "the scaler exited before it answered"
        return (await stub.IsActive(REF, timeout=1)).result is False

    await aeventually(answers, "the scaler to answer IsActive", ignoring=(aio.AioRpcError,))
    return proc, channel, address


@pytest.fixture
async def scaler(
    processes: ProcessGroups, redis_url: str, tmp_path: Path
) -> AsyncIterator[tuple[subprocess.Popen[Any], pb_grpc.ExternalScalerStub]]:
    proc, channel, _ = await started_scaler(processes, redis_url, tmp_path)
    try:
        yield proc, pb_grpc.ExternalScalerStub(channel)
    finally:
        await channel.close()


async def test_the_first_job_is_pushed_at_once_and_its_end_too(
    scaler: tuple[subprocess.Popen[Any], pb_grpc.ExternalScalerStub], redis_url: str
) -> None:
    proc, stub = scaler
    alice = AsyncClient(make_settings(redis_url=redis_url), api_key=ALICE_KEY)
    stream = stub.StreamIsActive(REF)
    try:
        first = await asyncio.wait_for(stream.read(), 5)
        assert first.result is False, "nothing queued: inactive"
        assert (await stub.IsActive(REF)).result is False

        sent = time.perf_counter()
        job_id = await alice.submit(MODEL, prompt="hi", max_tokens=4)
        pushed = await asyncio.wait_for(stream.read(), 5)
        took_s = time.perf_counter() - sent
        assert pushed.result is True
        assert took_s < PUSH_BOUND_S, f"pushed {took_s * 1000:.1f} ms after the enqueue"
        assert (await stub.IsActive(REF)).result is True

        request = pb.GetMetricsRequest(scaledObjectRef=REF, metricName="fairq-demand")
        (value,) = (await stub.GetMetrics(request)).metricValues
        assert (value.metricName, value.metricValueFloat, value.metricValue) == (
            "fairq-demand", 1.0, 1,
        )  # fmt: skip
        (spec,) = (await stub.GetMetricSpec(REF)).metricSpecs
        assert (spec.metricName, spec.targetSizeFloat) == ("fairq-demand", 4.0)

        await alice.cancel(job_id)  # the job ends: the model has no demand left
        ended = await asyncio.wait_for(stream.read(), 5)
        assert ended.result is False
        assert (await stub.IsActive(REF)).result is False

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(stream.read(), 5) is aio.EOF, "the stream ends cleanly"
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        stream.cancel()
        await alice.aclose()


async def test_a_trigger_for_a_model_it_does_not_serve_is_refused_saying_what_to_fix(
    scaler: tuple[subprocess.Popen[Any], pb_grpc.ExternalScalerStub],
) -> None:
    _, stub = scaler
    ref = pb.ScaledObjectRef(name="engine-x", scalerMetadata={"model": "nobody-serves-this"})
    with pytest.raises(aio.AioRpcError) as refused:
        await stub.IsActive(ref)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    told = str(refused.value.details())
    assert "model 'nobody-serves-this' is not served by this scaler" in told
    assert "fix the trigger's `model`" in told
    with pytest.raises(aio.AioRpcError) as no_model:
        await stub.GetMetricSpec(pb.ScaledObjectRef(name="engine-y"))
    assert "names no model" in str(no_model.value.details())


def test_a_taken_port_is_one_line_and_exit_1(redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump(make_config()))
    env = {"FAIRQ_CONFIG": str(tmp_path / "fairq.yaml"), "FAIRQ_REDIS_URL": redis_url,
           "FAIRQ_METRICS_PORT": "0"}  # fmt: skip
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = fairq("keda-scaler", "--port", port, env=env)
    assert done.returncode == 1, done.stderr
    assert f"fairq: ScalerError: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_tls_options_that_cannot_work_are_a_configuration_error(
    redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump(make_config()))
    (tmp_path / "cert.pem").write_text("not read: the key is missing")
    env = {"FAIRQ_CONFIG": str(tmp_path / "fairq.yaml"), "FAIRQ_REDIS_URL": redis_url}
    done = fairq("keda-scaler", "--tls-cert", str(tmp_path / "cert.pem"), env=env)
    assert done.returncode == 2
    assert "configuration error: TLS needs both --tls-cert and --tls-key" in done.stderr


async def test_with_tls_it_answers_a_client_that_trusts_its_certificate(
    processes: ProcessGroups, redis_url: str, tmp_path: Path
) -> None:
    ca, cert, key = make_certificates(tmp_path)
    trusting = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    _, channel, address = await started_scaler(
        processes, redis_url, tmp_path, *tls, credentials=trusting
    )  # it answered IsActive over TLS
    plain = aio.insecure_channel(address)
    try:
        with pytest.raises(aio.AioRpcError) as refused:
            await pb_grpc.ExternalScalerStub(plain).IsActive(REF, timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, "plaintext is not served"
    finally:
        await plain.close()
        await channel.close()


async def test_a_job_served_to_its_end_by_a_real_engine_pushes_active_then_idle(
    processes: ProcessGroups, redis_url: str, tmp_path: Path
) -> None:
    with sim() as engine:
        config = make_config([engine], quick=True)
        _, channel, _ = await started_scaler(processes, redis_url, tmp_path, config=config)
        stub = pb_grpc.ExternalScalerStub(channel)
        settings = make_settings(redis_url, [engine], quick=True)
        alice = AsyncClient(settings, api_key=ALICE_KEY)
        stream = stub.StreamIsActive(REF)
        try:
            assert (await asyncio.wait_for(stream.read(), 5)).result is False
            async with components(settings):
                job_id = await alice.submit(MODEL, prompt="hi", max_tokens=8)
                assert (await asyncio.wait_for(stream.read(), 5)).result is True
                idle = await asyncio.wait_for(stream.read(), 15)
                assert idle.result is False, "the job completed: nothing left to serve"
                assert (await alice.status(job_id)).state == JobState.COMPLETED
        finally:
            stream.cancel()
            await alice.aclose()
            await channel.close()


async def test_without_redis_it_answers_unavailable_so_keda_keeps_the_replicas(
    processes: ProcessGroups, tmp_path: Path
) -> None:
    (tmp_path / "fairq.yaml").write_text(yaml.safe_dump(make_config()))
    port = free_port()
    env = {**os.environ, "FAIRQ_CONFIG": str(tmp_path / "fairq.yaml"),
           "FAIRQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens
           "FAIRQ_METRICS_PORT": "0", "FAIRQ_LOG_LEVEL": "ERROR"}  # fmt: skip
    proc = processes.start(
        [sys.executable, "-m", "fairq", "keda-scaler", "--port", str(port)], env=env
    )
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ExternalScalerStub(channel)

    async def refused() -> aio.AioRpcError | None:
        assert proc.poll() is None, "the scaler exited: it must wait for Redis"
        try:
            await stub.IsActive(REF, timeout=1)
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE and "Redis" in str(exc.details()):
                return exc
        return None

    try:
        error = await aeventually(refused, "IsActive to answer UNAVAILABLE")
        assert "was not read from Redis" in str(error.details())
    finally:
        await channel.close()
