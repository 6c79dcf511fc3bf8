"""The engine side of the fairness benchmark: its queue over time, read from /metrics.

``EngineWatch`` scrapes the engine every 250 ms while an arm runs and keeps
what it saw: requests waiting and running, and the cumulative output tokens
and inter-token-latency histogram, from which the recent time per output token
follows (the figure fairq's TPOT ceiling looks at), and the engine's preemptions.
``step_ms`` is the benchmark's unit of time: the engine's own mean time per
output token over a window, from the same histogram. Works against the
simulator and a real vLLM alike: both use vLLM's metric names. Before any arm,
``served_models`` reads what the engine serves and ``reported_policy`` the
scheduling policy it says it runs, if it says one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from statistics import median

import httpx
from prometheus_client.parser import text_string_to_metric_families

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
GENERATED = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
# Tokens computed per engine step (decodes and prompt tokens alike): its count is the
# engine's steps, its sum less the output tokens the prompt tokens it prefilled
ITERATION = "vllm:iteration_tokens_total"
# The simulator's own: its steps' modeled time and the time its timeline lost while busy
SIM_MODELED = "fairq_sim_step_seconds_total"
SIM_OVERRUN = "fairq_sim_step_overrun_seconds_total"
# The current name first; vLLM V0 called the per-token histogram time_per_output_token.
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")


@dataclass(frozen=True)
class Sample:
    t_s: float  # when it was taken: perf_counter(), or seconds after t=0 once shifted
    waiting: float
    running: float
    generated: float  # cumulative output tokens
    itl_sum_s: float
    itl_count: float
    preemptions: float | None = None  # cumulative; None: the engine does not export it
    steps: float | None = None  # cumulative engine steps; None: not exported
    step_tokens: float | None = None  # cumulative tokens those steps computed
    sim_modeled_s: float | None = None  # the simulator's: its steps' modeled time
    sim_overrun_s: float | None = None  # and the time its timeline lost while busy


def parse_sample(text: str, model: str, t_s: float) -> Sample:
    """One scrape, summed over the series of ``model`` (or unlabelled series)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model_name", model) == model:
                values[s.name] = values.get(s.name, 0.0) + float(s.value)
    itl = next((name for name in ITL if f"{name}_count" in values), ITL[0])
    return Sample(
        t_s=t_s,
        waiting=values.get(WAITING, 0.0),
        running=values.get(RUNNING, 0.0),
        generated=values.get(GENERATED, 0.0),
        itl_sum_s=values.get(f"{itl}_sum", 0.0),
        itl_count=values.get(f"{itl}_count", 0.0),
        preemptions=values.get(PREEMPTIONS),
        steps=values.get(f"{ITERATION}_count"),
        step_tokens=values.get(f"{ITERATION}_sum"),
        sim_modeled_s=values.get(SIM_MODELED),
        sim_overrun_s=values.get(SIM_OVERRUN),
    )


async def scrape(client: httpx.AsyncClient, base_url: str, model: str, t_s: float) -> Sample:
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    return parse_sample(response.text, model, t_s)


class EngineWatch:
    """Scrape the engine at a fixed interval until cancelled; failed scrapes are counted."""

    def __init__(self, base_url: str, model: str, interval_s: float = 0.25) -> None:
        self.base_url = base_url
        self.model = model
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.failures = 0

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self.interval_s * 4) as client:
            while True:
                started = time.perf_counter()
                try:
                    self.samples.append(await scrape(client, self.base_url, self.model, started))
                except (httpx.HTTPError, ValueError):
                    self.failures += 1
                await asyncio.sleep(max(0.0, started + self.interval_s - time.perf_counter()))

    def relative_to(self, t0: float) -> list[Sample]:
        """The samples with times in seconds after ``t0`` (negative: before it)."""
        return [replace(s, t_s=s.t_s - t0) for s in self.samples]


def tpot_ms(samples: Iterable[Sample]) -> list[float | None]:
    """Mean time per output token between each scrape and the one before (None: no token)."""
    out: list[float | None] = []
    previous: Sample | None = None
    for sample in samples:
        tokens = sample.itl_count - previous.itl_count if previous else 0.0
        seconds = sample.itl_sum_s - previous.itl_sum_s if previous else 0.0
        out.append(seconds / tokens * 1000 if tokens > 0 else None)
        previous = sample
    return out


def step_ms(samples: Sequence[Sample], start_s: float, end_s: float) -> float | None:
    """The engine's mean time per output token between the first and the last scrape
    taken in [start_s, end_s]: Δsum / Δcount of its inter-token-latency histogram
    (None: fewer than two scrapes, or no token between them)."""
    inside = [s for s in samples if start_s <= s.t_s <= end_s]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    tokens = last.itl_count - first.itl_count
    return (last.itl_sum_s - first.itl_sum_s) / tokens * 1000 if tokens > 0 else None


def preemptions(samples: Sequence[Sample]) -> float | None:
    """Preemptions between the first and the last scrape (None: not exported)."""
    counts = [s.preemptions for s in samples if s.preemptions is not None]
    return counts[-1] - counts[0] if counts else None


def engine_work(samples: Sequence[Sample]) -> dict[str, float | None] | None:
    """What the engine computed between the first and the last scrape: its steps, and the
    prompt tokens it prefilled (the steps' tokens less the output tokens; a prompt computed
    twice -- a request preempted, or taken back by fairq and sent again -- counts twice);
    for the simulator also its steps' modeled time and the time its timeline lost.
    None: the engine does not export its steps."""
    counted = [
        (s, s.steps, s.step_tokens)
        for s in samples
        if s.steps is not None and s.step_tokens is not None
    ]
    if len(counted) < 2:
        return None
    (first, steps0, tokens0), (last, steps1, tokens1) = counted[0], counted[-1]
    return {
        "steps": steps1 - steps0,
        "prefill_tokens": tokens1 - tokens0 - (last.generated - first.generated),
        "sim_modeled_s": _delta(first.sim_modeled_s, last.sim_modeled_s),
        "sim_overrun_s": _delta(first.sim_overrun_s, last.sim_overrun_s),
    }


def backlogged_work(samples: Sequence[Sample], drain_s: float) -> dict[str, float] | None:
    """The engine's steps and output tokens from the first scrape to the last one before
    ``drain_s``, when the flood stopped being backlogged (at most a batch of it was left).
    Engine steps for the same work compare without the drain: the last answers of a
    flood end one by one, over up to one answer's length of steps, whichever order the
    arm served them in, and FIFO's equal answers started together end together. None:
    the engine does not count its steps, or fewer than two scrapes came before."""
    counted = [s for s in samples if s.steps is not None and s.t_s <= drain_s]
    if len(counted) < 2:
        return None
    first, last = counted[0], counted[-1]
    assert first.steps is not None and last.steps is not None
    steps, tokens = last.steps - first.steps, last.generated - first.generated
    return {"steps": steps, "tokens": tokens, "tokens_per_step": tokens / steps if steps else 0.0}


def batch_run(samples: Sequence[Sample]) -> float:
    """What the engine ran at once while requests waited (the median over those scrapes):
    its batch, or the running set its KV cache holds, which can be far below the batch's
    peak (a KV-bound engine ran 40 of a long flood's short prompts at once, then about 18
    as the answers grew). The peak where nothing ever waited."""
    full = sorted(s.running for s in samples if s.waiting > 0)
    if full:
        return median(full)
    return max((s.running for s in samples), default=0.0)


def drain_s(heavy_ends_s: Sequence[float], batch: float) -> float | None:
    """When the flood stopped being backlogged: the end of its request after which at
    most ``batch`` of its requests were left (None: it never filled the batch)."""
    ends = sorted(heavy_ends_s)
    left_at = len(ends) - int(batch)
    return ends[left_at - 1] if left_at >= 1 else None


def _delta(first: float | None, last: float | None) -> float | None:
    return None if first is None or last is None else last - first


async def wait_idle(base_url: str, model: str, timeout_s: float) -> None:
    """Until the engine has nothing waiting or running (a real engine between arms)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.monotonic() < deadline:
            try:
                sample = await scrape(client, base_url, model, 0.0)
                if sample.waiting == 0 and sample.running == 0:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the engine at {base_url} did not become idle in {timeout_s:.0f}s")


def served_models(base_url: str) -> dict[str, int | None]:
    """Model -> its context length (``max_model_len``, None if not said), from the
    engine's GET /v1/models in the order listed; vLLM and the simulator both say it."""
    response = httpx.get(f"{base_url}/v1/models", timeout=10.0)
    response.raise_for_status()
    data = response.json().get("data") or []
    if not data:
        raise ValueError(f"{base_url}/v1/models lists no model")
    return {str(m["id"]): _int_or_none(m.get("max_model_len")) for m in data}


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def reported_policy(base_url: str) -> str | None:
    """The scheduling policy the engine says it runs: vLLM's GET /server_info (served only
    with VLLM_SERVER_DEV_MODE=1; the simulator's in its profile's dev_mode), its
    ``vllm_config.scheduler_config.policy``. None: it does not say."""
    try:
        # A real vLLM gathers its system information for this once: seconds, not a hang.
        response = httpx.get(f"{base_url}/server_info?config_format=json", timeout=60.0)
        response.raise_for_status()
        policy = response.json()["vllm_config"]["scheduler_config"]["policy"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return policy if policy in ("fcfs", "priority") else None
