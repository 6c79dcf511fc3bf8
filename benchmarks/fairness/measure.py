"""Measuring one arm in its environment: idle TTFT first, then the flood under watch.

First the arm's engine must serve a context the scenario fits (its GET
/v1/models); a misfit fails the arm before any load. Before the flood, a few
light requests on the idle engine give the reference TTFT (straight to the
engine) and the arm's own idle TTFT (through its path, which also warms fairq's
connections and script cache up). Then the engine's /metrics is scraped from
half a second before t=0 until half a second after the last response, and the
CPU of the engine, of fairq and of the load client is read over the flood.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fairness.report import arm_summary, engine_summary
from benchmarks.fairness.resumed import fairq_preemptions, tokenizer_decode
from benchmarks.fairness.scenarios import LIGHT_PROMPT_TOKENS, context_problem, plan
from benchmarks.fairness.shares import shares
from benchmarks.fairness.stack import IDLE_USER, ArmEnv, Setup
from benchmarks.fairness.stages import job_stages
from benchmarks.lib.cpu import CpuMeter
from benchmarks.lib.engine_watch import EngineWatch, batch_run, drain_s, served_models
from benchmarks.lib.load import (
    CONNECT_TIMEOUT_S,
    LoadResult,
    RequestResult,
    Target,
    make_prompt,
    run_load,
    send,
)
from benchmarks.lib.stats import median
from benchmarks.lib.vllm_engine import resolve_home
from workers.engine_http import EngineClient

IDLE_REQUESTS = 5
PATH_IDLE_REQUESTS = 3
IDLE_TIMEOUT_S = 60.0  # a light request on an idle engine
WATCH_MARGIN_S = 0.5
BUCKET_S = 0.05  # the time resolution of the heavy users' token counts (mixed)


async def idle_ttft_s(target: Target, requests: int, tokens: int) -> float | None:
    """Median TTFT of light requests sent one at a time, after one unmeasured warm-up."""
    ttfts: list[float] = []
    rng = random.Random(f"idle {target.url}")
    async with EngineClient(CONNECT_TIMEOUT_S) as client:
        for i in range(requests + 1):
            prompt = make_prompt(f"idle {i} {rng.random()}", LIGHT_PROMPT_TOKENS, rng)
            result = RequestResult(IDLE_USER, False, 0.0, tokens)
            try:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    await send(client, target, result, prompt, stream=True, t0=time.perf_counter())
            except TimeoutError:
                result.error = f"no answer within {IDLE_TIMEOUT_S:.0f} s"
            if result.error is not None:
                raise RuntimeError(f"a request on the idle engine failed: {result.error}")
            if i > 0 and result.ttft_s is not None:
                ttfts.append(result.ttft_s)
    return median(ttfts) if ttfts else None


def check_context(engine_url: str, setup: Setup) -> None:
    """Raise ValueError when the arm's engine serves a context the scenario does not fit."""
    context = served_models(engine_url).get(setup.model)
    problem = None if context is None else context_problem(setup.scenario, context)
    if problem is not None:
        raise ValueError(problem)


async def measure_arm(
    env: ArmEnv, setup: Setup, deadline_s: float, tpot_ceiling_ms: float, engine_idle: bool
) -> tuple[dict[str, Any], float | None]:
    """The arm's summary, and the idle engine's TTFT when ``engine_idle`` asks for it."""
    check_context(env.engine_url, setup)
    tokens = setup.scenario.light_output_tokens
    direct = Target(f"{env.engine_url}/v1/chat/completions", setup.model)
    idle_s = await idle_ttft_s(direct, IDLE_REQUESTS, tokens) if engine_idle else None
    path_idle_s = await idle_ttft_s(env.target, PATH_IDLE_REQUESTS, tokens)
    load, samples, failures, cpu = await _flood(env, setup, deadline_s)
    until = load.heavy_done_s if load.heavy_done_s is not None else load.wall_s
    batch = batch_run(samples)
    heavy_ends = [r.end_s for r in load.requests if r.heavy and r.end_s is not None]
    engine = engine_summary(samples, until, tpot_ceiling_ms, failures, drain_s(heavy_ends, batch))
    taken = await asyncio.to_thread(_fairq_preemptions, env, setup)
    light, flood = await asyncio.to_thread(_stages, env, setup)
    summary = arm_summary(load, path_idle_s, engine, cpu, _shares(load, setup),
                          fairq_preemptions=taken, light_stages=light,
                          flood_stages=flood)  # fmt: skip
    summary["admission_refusals"] = await _refusals(env, setup)
    return summary, idle_s


async def _refusals(env: ArmEnv, setup: Setup) -> dict[str, float] | None:
    """The dispatcher's rounds that found the model's endpoint full, by reason (None: the
    arm does not run fairq, or its dispatcher serves no metrics)."""
    stack = env.stacks[0] if env.stacks else None
    if stack is None or "dispatcher-0" not in stack.metrics_ports:
        return None
    async with httpx.AsyncClient(timeout=5.0) as client:
        page = (await client.get(stack.metrics_url("dispatcher-0"))).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "fairq_admission_refusals_total" and (
                sample.labels.get("model") == setup.model
            ):
                reason = sample.labels["reason"]
                found[reason] = found.get(reason, 0.0) + sample.value
    return found


def _stages(
    env: ArmEnv, setup: Setup
) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """Each light job's and each flood job's stages inside fairq (None, None: the arm does
    not run fairq)."""
    if not env.stacks or env.stacks[0].redis_url is None:
        return None, None
    light = setup.scenario.light_user_names()
    jobs = job_stages(env.stacks[0].redis_url, setup.model, [*light, *setup.scenario.heavy_users()])
    return [j for j in jobs if j["user"] in light], [j for j in jobs if j["user"] not in light]


def _fairq_preemptions(env: ArmEnv, setup: Setup) -> dict[str, Any] | None:
    """What fairq took back out of the engine, and whether its resumed answers were whole
    (None: the arm does not run fairq)."""
    if not env.stacks or env.stacks[0].redis_url is None:
        return None
    decode = None
    home = setup.engine.vllm_home
    if setup.engine.kind == "vllm" and home is not None:
        vllm = resolve_home(home)
        decode = tokenizer_decode(vllm.python, vllm.model / "tokenizer.json")
    return fairq_preemptions(env.stacks[0].redis_url, setup.model, setup.engine.kind, decode)


async def _flood(
    env: ArmEnv, setup: Setup, deadline_s: float
) -> tuple[LoadResult, list[Any], int, dict[str, Any]]:
    """The scenario under watch: its load, the engine's samples (t=0 at the flood's
    start), the failed scrapes, and the CPU spent."""
    watch, meter = EngineWatch(env.engine_url, setup.model), CpuMeter(env.groups)
    bucket_s = BUCKET_S if setup.scenario.name == "mixed" else None
    starts: list[float] = []
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(WATCH_MARGIN_S)
        meter.start()
        load = await run_load(env.target, plan(setup.scenario), deadline_s, dead=env.dead,
                              on_start=starts.append, bucket_s=bucket_s,
                              heavy_window=env.heavy_window)  # fmt: skip
        cpu = meter.stop()
        await asyncio.sleep(WATCH_MARGIN_S)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return load, watch.relative_to(starts[0]), watch.failures, cpu


def _shares(load: LoadResult, setup: Setup) -> dict[str, Any] | None:
    if load.bucket_s is None:
        return None
    heavy = [r for r in load.requests if r.heavy]
    return shares(heavy, setup.scenario.heavy_users(), load.bucket_s)
