"""The fleet benchmark's autoscaler on the external-push trigger: KEDA's calls to
``fairq keda-scaler`` over gRPC, and KEDA's rules (``keda``) on the answers.

What KEDA does with one ScaledObject whose trigger is ``external-push`` (its
``pkg/scaling/scale_handler.go`` and ``pkg/scalers/external_scaler.go``), and what this
client does for each model:

* one StreamIsActive stream, held open; a message is handed to the scale executor at
  once: "active" with the target at zero scales it to one replica (``on_push``);
  "inactive" is ignored. A stream that ends or fails is opened again after 2 s, then
  4 s, 8 s ... at most a minute (KEDA's retry);
* every polling interval (``poll_s``), GetMetrics then IsActive (KEDA's
  ``GetMetricsAndActivity``): the activity decides the step to zero after the cooldown,
  the metric over GetMetricSpec's target the HPA's 1..N (``target``);
* GetMetricSpec once, when the ScaledObject is set up (KEDA builds the HPA from it).

The decisions are pure (``PushDecisions``: hand-made events in the tests); ``PushScaler``
is the gRPC client that feeds them and starts and stops replicas (``Fleet``);
``scaler_process`` runs ``fairq keda-scaler`` as a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from grpc import aio

from benchmarks.fleet.keda import ModelScale, Rules, on_push, target
from benchmarks.fleet.replicas import Fleet
from benchmarks.fleet.scaler import replicas, resize
from fairq.stack.children import start_child
from fairq.stack.localredis import free_port
from scaler.protocol import externalscaler_pb2 as pb
from scaler.protocol import externalscaler_pb2_grpc as pb_grpc

RETRY_FIRST_S = 2.0  # KEDA's StreamIsActive retry: 2 s, doubled each time, at most 60 s
RETRY_MAX_S = 60.0
CALL_TIMEOUT_S = 5.0
NAMESPACE = "fleet"

Resize = Callable[[str, int, str], None]  # (model, replicas wanted, cause)


class PushScalerError(RuntimeError):
    """The scaler did not answer as KEDA needs (the message says what is wrong)."""


@dataclass
class PushDecisions:
    """KEDA's decisions for each model from the scaler's messages and answers. Pure: the
    caller says how many replicas each model has (``live``) and applies ``resize``."""

    rules: Rules
    live: Callable[[str], int]
    resize: Resize
    targets: dict[str, float] = field(default_factory=dict)  # GetMetricSpec, per model
    states: dict[str, ModelScale] = field(default_factory=dict)
    pushes: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    woken_by_push: int = 0
    polls: int = 0

    def pushed(self, model: str, active: bool, now_s: float) -> None:
        """One StreamIsActive message."""
        self.pushes[active] += 1
        current = self.live(model)
        wanted = on_push(self._state(model), active, current, now_s, self._rules(model))
        if wanted != current:
            self.woken_by_push += 1
            self.resize(model, wanted, "push")

    def polled(self, answers: dict[str, tuple[float, bool]], now_s: float) -> None:
        """One polling interval's answers: model -> (GetMetrics' value, IsActive). A
        model without an answer (its calls failed) keeps its replicas, as KEDA does on a
        scaler error without a fallback."""
        self.polls += 1
        for model, (demand, active) in answers.items():
            current = self.live(model)
            state, rules = self._state(model), self._rules(model)
            wanted = target(state, demand, current, now_s, rules, active=active)
            if wanted != current:
                self.resize(model, wanted, "poll")

    def _state(self, model: str) -> ModelScale:
        return self.states.setdefault(model, ModelScale())

    def _rules(self, model: str) -> Rules:
        """The rules with the trigger's target as GetMetricSpec gave it."""
        per_replica = self.targets.get(model, self.rules.demand_per_replica)
        return replace(self.rules, demand_per_replica=per_replica)


def scaled_object(model: str, demand_per_replica: float) -> pb.ScaledObjectRef:
    """The reference KEDA sends with each call: the trigger's metadata as ``fairq k8s
    render`` writes it (``fairq.k8s.engines``; the scaler reads ``model`` and
    ``demandPerReplica``)."""
    metadata = {"model": model, "demandPerReplica": str(demand_per_replica)}
    return pb.ScaledObjectRef(name=f"engine-{model}", namespace=NAMESPACE, scalerMetadata=metadata)


@dataclass
class PushScaler:
    fleet: Fleet
    rules: Rules
    address: str  # the scaler's host:port
    poll_s: float
    models: tuple[str, ...]
    decisions: PushDecisions = field(init=False)
    failed_polls: int = 0  # a model's GetMetrics or IsActive that failed
    stream_failures: int = 0  # StreamIsActive streams that ended or failed
    max_replicas_seen: int = 0
    _opened: set[str] = field(default_factory=set)  # models whose stream sent its first state

    def __post_init__(self) -> None:
        def apply(model: str, wanted: int, cause: str) -> None:
            resize(self.fleet, model, wanted, cause)
            self.max_replicas_seen = max(self.max_replicas_seen, replicas(self.fleet, self.models))

        self.decisions = PushDecisions(self.rules, lambda m: len(self.fleet.live(m)), apply)

    @property
    def polls(self) -> int:
        return self.decisions.polls

    async def run(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        """Set every model's ScaledObject up, open its stream, set ``ready`` once every
        stream has sent its first state, then poll until ``stop``."""
        async with aio.insecure_channel(self.address) as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            await self._metric_specs(stub)
            streams = [asyncio.create_task(self._stream(stub, m)) for m in self.models]
            try:
                await self._until_open()
                ready.set()
                await self._poll_until(stub, stop)
            finally:
                for task in streams:
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)

    async def _metric_specs(self, stub: pb_grpc.ExternalScalerStub) -> None:
        for model in self.models:
            ref = scaled_object(model, self.rules.demand_per_replica)
            try:
                reply = await stub.GetMetricSpec(ref, timeout=CALL_TIMEOUT_S)
            except aio.AioRpcError as exc:
                raise PushScalerError(
                    f"the keda scaler refused GetMetricSpec for {model}: "
                    f"{exc.code().name} {exc.details()}"
                ) from exc
            specs = [s.targetSizeFloat or float(s.targetSize) for s in reply.metricSpecs]
            if len(specs) != 1 or not specs[0] > 0:
                raise PushScalerError(f"GetMetricSpec for {model} gave {specs}: want one > 0")
            self.decisions.targets[model] = specs[0]

    async def _until_open(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self._opened) < len(self.models):
            if time.monotonic() > deadline:
                missing = sorted(set(self.models) - self._opened)[:5]
                raise PushScalerError(f"no StreamIsActive state in {timeout_s:g} s for {missing}")
            await asyncio.sleep(0.02)

    async def _stream(self, stub: pb_grpc.ExternalScalerStub, model: str) -> None:
        """One model's StreamIsActive, held open and reopened as KEDA does."""
        ref = scaled_object(model, self.rules.demand_per_replica)
        retry_s = RETRY_FIRST_S
        while True:
            try:
                async for reply in stub.StreamIsActive(ref):
                    self._opened.add(model)
                    self.decisions.pushed(model, reply.result, time.monotonic())
                retry_s = RETRY_FIRST_S  # ended cleanly: KEDA starts its backoff over
            except aio.AioRpcError:
                pass
            self.stream_failures += 1
            await asyncio.sleep(retry_s)
            retry_s = min(RETRY_MAX_S, retry_s * 2)

    async def _poll_until(self, stub: pb_grpc.ExternalScalerStub, stop: asyncio.Event) -> None:
        while not stop.is_set():
            began = time.monotonic()
            polled = await asyncio.gather(*(self._poll(stub, m) for m in self.models))
            answers = {model: answer for model, answer in polled if answer is not None}
            self.decisions.polled(answers, time.monotonic())
            wait_s = max(0.0, self.poll_s - (time.monotonic() - began))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait_s)

    async def _poll(
        self, stub: pb_grpc.ExternalScalerStub, model: str
    ) -> tuple[str, tuple[float, bool] | None]:
        """KEDA's GetMetricsAndActivity for one trigger: GetMetrics, then IsActive."""
        ref = scaled_object(model, self.rules.demand_per_replica)
        request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="fairq-demand")
        try:
            metrics = await stub.GetMetrics(request, timeout=CALL_TIMEOUT_S)
            active = await stub.IsActive(ref, timeout=CALL_TIMEOUT_S)
        except aio.AioRpcError:
            self.failed_polls += 1
            return model, None
        values = [v.metricValueFloat or float(v.metricValue) for v in metrics.metricValues]
        return model, (sum(values), active.result)


@contextlib.contextmanager
def scaler_process(env: dict[str, str], timeout_s: float = 30.0) -> Iterator[tuple[str, int]]:
    """``fairq keda-scaler`` on a free port of 127.0.0.1, with ``env`` (the stack's: its
    configuration file and Redis); yields its address and process id once it listens,
    and stops it after, however the block ends."""
    port = free_port()
    args = [sys.executable, "-m", "fairq", "keda-scaler", "--port", str(port)]
    env = {**env, "FAIRQ_METRICS_PORT": "0"}
    # start_child: it dies with this process, however this process ends.
    proc = subprocess.Popen(args, env=env, preexec_fn=start_child)  # noqa: PLW1509
    try:
        deadline = time.monotonic() + timeout_s
        while not _listens(port):
            if proc.poll() is not None:
                raise PushScalerError(f"fairq keda-scaler exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise PushScalerError(f"fairq keda-scaler did not listen in {timeout_s:g} s")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _listens(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0
