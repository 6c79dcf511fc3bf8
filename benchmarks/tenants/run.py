"""The interactive tail's arms, each on a fresh engine, side by side in one run.

An arm runs two phases on its own engine: the interactive stream alone (its no-flood
baseline), then the same stream while the power user's flood and the batch tenant's
lines arrive at t=0 (``benchmarks.tenants.plan``). The interactive users send from a
process of their own (``benchmarks.lib.load.run_load``): the flood's streams, read here,
would otherwise delay their first tokens on this event loop.

(a) the engine alone, FIFO: the baseline every step count is compared with;
(e) the engine alone with its priority policy, each request labelled by the client
    (interactive 0, the flood and the batch lines 1): what a peer that needs labels
    is told;
(c) fairq with its defaults, told nothing: the batch lines go through its Batch API
    (the lowest band), everything else as plain chat completions.

With a real vLLM the engine runs on its own core (``ENGINE_CPUS``), fairq and the load on
the other, as in ``fairq bench fairness``.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.cpu import FAIRQ_CPUS, pinned
from benchmarks.lib.engine_watch import EngineWatch, Sample, engine_work, wait_idle
from benchmarks.lib.load import LoadResult, RequestResult, Target, run_load
from benchmarks.lib.provision import WORKERS, Engine, EngineChoice, engine_for, worker_slots
from benchmarks.tenants.batches import BatchResult, batch_file, run_batch
from benchmarks.tenants.figures import arm_status, latencies, token_gaps
from benchmarks.tenants.plan import (
    BATCH,
    BATCH_USER,
    INTERACTIVE,
    POWER,
    Sent,
    TailSizes,
    batch_lines,
    flood,
    interactive_stream,
)
from broker import hash_key
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack

START_TIMEOUT_S = 60.0
IDLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class TenantArm:
    key: str
    title: str
    via_fairq: bool
    engine_policy: str = "fcfs"
    labels: bool = False  # the client sets each request's priority


ARMS = {
    arm.key: arm
    for arm in (
        TenantArm("a", "engine FIFO (direct)", via_fairq=False),
        TenantArm(
            "e",
            "engine priority (direct; told: interactive 0, the rest 1)",
            via_fairq=False,
            engine_policy="priority",
            labels=True,
        ),
        TenantArm(
            "c", "fairq defaults (told nothing; batch lines through /v1/batches)", via_fairq=True
        ),
    )
}


@dataclass(frozen=True)
class _Where:
    """Where a phase sends and what it watches."""

    target: Target
    engine: Engine
    model: str
    deadline_s: float
    dead: Callable[[], str | None]


@dataclass
class Phase:
    """One phase's requests with their classes (in the load's order), the engine's
    samples over it (s after its t=0), and the batch sent through the Batch API."""

    sent: Sequence[Sent]
    load: LoadResult
    samples: list[Sample]
    batch: BatchResult | None = None

    def results(self, klass: str) -> list[RequestResult]:
        return [r for s, r in zip(self.sent, self.load.requests, strict=True) if s.klass == klass]


def run_arm(
    arm: TenantArm, sizes: TailSizes, choice: EngineChoice, deadline_s: float
) -> dict[str, Any]:
    """Both phases of ``arm`` on a fresh engine (and fairq stack); its summary."""
    stream, power, lines = interactive_stream(sizes), flood(sizes), batch_lines(sizes)
    users = sorted({s.planned.user for s in (*stream, *power, *lines)})
    keys = {user: f"fq-tenants-{user.lower()}" for user in users}
    with _arm_env(arm, choice, keys, sizes) as (engine, stack):
        where = _Where(
            _target(arm, choice, engine, stack, keys),
            engine,
            choice.model,
            deadline_s,
            _dead(engine, stack),
        )
        alone = asyncio.run(_phase(where, stream))
        asyncio.run(wait_idle(engine.url, choice.model, IDLE_TIMEOUT_S))
        if stack is None:  # the batch lines as plain requests
            flooded = asyncio.run(_phase(where, [*stream, *power, *lines]))
        else:
            sender = _batch_sender(stack, keys[BATCH_USER], lines, choice.model)
            flooded = asyncio.run(_phase(where, [*stream, *power], batch=sender))
    return summary(arm, alone, flooded)


@contextlib.contextmanager
def _arm_env(
    arm: TenantArm, choice: EngineChoice, keys: dict[str, str], sizes: TailSizes
) -> Iterator[tuple[Engine, Stack | None]]:
    """The arm's engine, and its fairq stack where it has one; all stopped on the way out."""
    with contextlib.ExitStack() as on_exit:
        folder = on_exit.enter_context(tempfile.TemporaryDirectory(prefix="fairq-tenants-"))
        engine = on_exit.enter_context(engine_for(choice, arm.engine_policy, Path(folder)))
        if choice.pinning:  # vLLM pins itself to ENGINE_CPUS; fairq and the load the rest
            on_exit.enter_context(pinned(FAIRQ_CPUS))
        stack = None
        if arm.via_fairq:
            stack = Stack(
                fairq_config(choice.model, engine.url, keys, sizes),
                gateway_port=free_port(),
                workers=WORKERS,
                batch_workers=1,
                env={
                    "FAIRQ_LOG_LEVEL": "WARNING",
                    "FAIRQ_WORKER_CONCURRENCY": str(worker_slots(_requests(sizes))),
                },
            )
            stack.start(START_TIMEOUT_S)  # stops what it started if it fails
            on_exit.callback(stack.stop)
        yield engine, stack


def fairq_config(
    model: str, engine_url: str, keys: dict[str, str], sizes: TailSizes
) -> dict[str, Any]:
    """fairq's configuration for the arm: the model with nothing tuned, a key per user."""
    api_keys = [{"sha256": hash_key(key), "user": user} for user, key in keys.items()]
    most = max(sizes.power_requests, sizes.batch_lines)
    return {
        "models": [
            {
                "name": model,
                "engine": "vllm",
                "endpoints": [engine_url],
                "allow_fields": ["ignore_eos"],
            }
        ],
        "api_keys": api_keys,
        "max_queued_per_user": max(1000, most + 10),
    }


def _requests(sizes: TailSizes) -> int:
    """Every request of the plan: all may be open at once."""
    return sizes.interactive_requests + sizes.power_requests + sizes.batch_lines


def _target(
    arm: TenantArm, choice: EngineChoice, engine: Engine, stack: Stack | None, keys: dict[str, str]
) -> Target:
    if stack is not None:
        return Target(f"{stack.gateway_url}/v1/chat/completions", choice.model, keys=keys)
    return Target(f"{engine.url}/v1/chat/completions", choice.model, priorities=arm.labels)


def _dead(engine: Engine, stack: Stack | None) -> Callable[[], str | None]:
    def dead() -> str | None:
        return engine.dead() or (stack.dead() if stack is not None else None)

    return dead


BatchSender = Callable[[float, float], BatchResult]


def _batch_sender(stack: Stack, key: str, lines: Sequence[Sent], model: str) -> BatchSender | None:
    """Sends the lines as one batch through the stack's Batch API (None: no lines)."""
    if not lines:
        return None
    data, url = batch_file(lines, model), stack.gateway_url
    return lambda t0, deadline_s: run_batch(
        url, key, data, lines=len(lines), t0=t0, deadline_s=deadline_s
    )


async def _phase(where: _Where, sent: Sequence[Sent], batch: BatchSender | None = None) -> Phase:
    """Send ``sent`` (and the batch, at t=0) while watching the engine."""
    watch = EngineWatch(where.engine.url, where.model)
    watching = asyncio.ensure_future(watch.run())
    started: dict[str, Any] = {}

    def on_start(t0: float) -> None:
        started["t0"] = t0
        if batch is not None:
            loop = asyncio.get_running_loop()
            started["batch"] = loop.run_in_executor(None, batch, t0, where.deadline_s)

    try:
        planned = [s.planned for s in sent]
        load = await run_load(
            where.target, planned, where.deadline_s, dead=where.dead, on_start=on_start
        )
        result = await started["batch"] if "batch" in started else None
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    return Phase(sent, load, watch.relative_to(started["t0"]), result)


def summary(arm: TenantArm, alone: Phase, flooded: Phase) -> dict[str, Any]:
    """The arm's figures: the interactive class alone and under the flood, the flood's
    first tokens, the batch, the engine's work, and whether every request was answered."""
    errors = [r.error for r in (*alone.load.requests, *flooded.load.requests)]
    if flooded.batch is not None:
        errors += flooded.batch.errors()
    return {
        "title": arm.title,
        **arm_status(errors),
        "alone": stream_figures(alone.results(INTERACTIVE)),
        "flooded": stream_figures(flooded.results(INTERACTIVE)),
        "power_ttft_ms": latencies(_ttfts(flooded.results(POWER))).as_dict(),
        "batch": _batch_figures(flooded),
        "engine": engine_work(flooded.samples),
        "wall_s": flooded.load.wall_s,
    }


def stream_figures(results: Sequence[RequestResult]) -> dict[str, Any]:
    """TTFT and inter-token latency percentiles of a class's streams."""
    gaps = [gap for r in results for gap in token_gaps(r.reads, r.output_tokens)]
    return {"ttft_ms": latencies(_ttfts(results)).as_dict(), "itl_ms": latencies(gaps).as_dict()}


def _ttfts(results: Sequence[RequestResult]) -> list[float]:
    return [r.ttft_s for r in results if r.ttft_s is not None]


def _batch_figures(phase: Phase) -> dict[str, Any]:
    """Lines answered, and when the last was: through the Batch API, or as requests."""
    if phase.batch is not None:
        b = phase.batch
        return {
            "lines": b.lines,
            "completed": b.completed,
            "failed": b.failed,
            "end_s": b.end_s,
            "via": "batch API",
        }
    lines = phase.results(BATCH)
    ends = [r.end_s for r in lines if r.end_s is not None and r.error is None]
    return {
        "lines": len(lines),
        "completed": len(ends),
        "failed": len(lines) - len(ends),
        "end_s": max(ends, default=None),
        "via": "requests",
    }
