"""Measuring one arm in its environment: idle TTFT first, then the flood under watch.

Before the flood, a few light requests on the idle engine give the reference
TTFT (straight to the engine) and the arm's own idle TTFT (through its path,
which also warms fairq's connections and script cache up). Then the engine's
/metrics is scraped from half a second before t=0 until half a second after
the last response, while the scenario runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import httpx

from benchmarks._fairness_engine import EngineWatch
from benchmarks._fairness_load import (
    LIGHT_PROMPT_TOKENS,
    LoadResult,
    Target,
    light_request,
    make_prompt,
    run_load,
)
from benchmarks._fairness_report import arm_summary, engine_summary
from benchmarks._fairness_stack import IDLE_USER, ArmEnv, Setup
from benchmarks.stats import median

IDLE_REQUESTS = 5
PATH_IDLE_REQUESTS = 3
WATCH_MARGIN_S = 0.5


async def idle_ttft_s(target: Target, requests: int, tokens: int) -> float | None:
    """Median TTFT of light requests sent one at a time, after one unmeasured warm-up."""
    ttfts: list[float] = []
    rng = random.Random(f"idle {target.url}")
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        for i in range(requests + 1):
            prompt = make_prompt(f"idle {i} {rng.random()}", LIGHT_PROMPT_TOKENS, rng)
            result = await light_request(
                client, target, IDLE_USER, prompt=prompt, tokens=tokens, t0=time.perf_counter()
            )
            if result.error is not None:
                raise RuntimeError(f"a request on the idle engine failed: {result.error}")
            if i > 0 and result.ttft_s is not None:
                ttfts.append(result.ttft_s)
    return median(ttfts) if ttfts else None


async def measure_arm(
    env: ArmEnv, setup: Setup, deadline_s: float, tpot_ceiling_ms: float, engine_idle: bool
) -> tuple[dict[str, Any], float | None]:
    """The arm's summary, and the idle engine's TTFT when ``engine_idle`` asks for it."""
    tokens = setup.scenario.light_output_tokens
    direct = Target(f"{env.engine_url}/v1/chat/completions", setup.model)
    idle_s = await idle_ttft_s(direct, IDLE_REQUESTS, tokens) if engine_idle else None
    path_idle_s = await idle_ttft_s(env.target, PATH_IDLE_REQUESTS, tokens)
    watch = EngineWatch(env.engine_url, setup.model)
    starts: list[float] = []
    task = asyncio.create_task(watch.run())
    try:
        await asyncio.sleep(WATCH_MARGIN_S)
        load = await run_load(env.target, setup.scenario, deadline_s, env.dead, starts.append)
        await asyncio.sleep(WATCH_MARGIN_S)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    samples = watch.relative_to(starts[0])
    until = _power_end(load)
    engine = engine_summary(samples, until, tpot_ceiling_ms, watch.failures)
    return arm_summary(load, path_idle_s, engine), idle_s


def _power_end(load: LoadResult) -> float:
    return load.power_done_s if load.power_done_s is not None else load.wall_s
