"""The seed flood's fill bound, on paper: how fast a FIFO engine's batch must be refilled
to reach a share of FIFO's tokens/s, and what that rate costs a newcomer's first token,
in the engine's mean steps (the simulator's scheduler stepped without a clock: an estimate).

``fairq bench fairness --scenario seed`` measures fairq against straight FIFO; this
model says what any admission in front of a FIFO engine can reach at best, so a miss can
be told apart from a limit of the engine itself. It steps the simulator's own scheduler
and cost model (``sim/_scheduler.py``: vLLM's continuous batching reduced to
token counts; a step costs ``step_base_ms`` + ``step_per_seq_ms`` per decoding request +
``prefill_ms_per_token`` per prompt token in it), without its clock, through two
schedules:

* **FIFO**: every request sent at t = 0.
* **Paced** at ``rate`` refills per step, exactly (a perfect pacer: no dispatch jitter,
  no lag), into ``slots`` (the batch less the slots kept for newcomers).

A request's first token comes with the step that ends its prefill; it then decodes one
token a step (the scheduler's rules). A newcomer arriving at a uniformly drawn moment
waits out the step in progress, reaches the engine ``hop_ms`` after it arrived (fairq's
queue and hand-over), and is prefilled in the next step it is there for. No refill sent
after it joins that step (``clear_newcomer_step``); the refills that reached the engine
before it do, and where they reach it decides how often:

* **aligned**: every refill reaches the engine just as a step begins, so none waits for
  the next and the newcomer's step holds none (a pacer that knows the engine's step
  boundaries: the best case);
* **unaligned**: a step's refills reached the engine at uniformly drawn moments of the
  step before, as fairq's pacer sends them (it knows the engine's mean step, not where a
  step begins), so those that came before the newcomer are prefilled with it.

Its TTFT over the paced schedule's mean step is the figure the fairness criterion reads.

Run with ``python -m benchmarks.fairness.fill_bound`` (defaults: the seed flood on ``h100-8b``).
"""

from __future__ import annotations

import bisect
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import click

from sim import SchedSeq, Scheduler, SimProfile, load_profile


@dataclass(frozen=True)
class Flood:
    requests: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Schedule:
    """Each step's modeled cost (ms), the requests running (in the batch) after it, and the
    requests sent just before it (prefilled in it as far as its token budget goes)."""

    costs: list[float]
    running: list[int]
    sent: list[int]

    @property
    def total_ms(self) -> float:
        return sum(self.costs)

    @property
    def mean_step_ms(self) -> float:
        return self.total_ms / len(self.costs)


def _step(engine: Scheduler[SchedSeq], s: Schedule) -> None:
    """One step of the simulator's own scheduler (vLLM's, reduced to token counts): its
    modeled cost and the requests running after it."""
    plan = engine.schedule()
    engine.complete(plan)
    s.costs.append(plan.duration_s * 1000)
    s.running.append(len(engine.running))


def _send(engine: Scheduler[SchedSeq], flood: Flood, count: int) -> None:
    for _ in range(count):
        engine.add(SchedSeq(prompt_tokens=flood.prompt_tokens, max_tokens=flood.output_tokens))


def fifo(p: SimProfile, flood: Flood) -> Schedule:
    """Every request sent at t = 0 to a FIFO engine."""
    engine: Scheduler[SchedSeq] = Scheduler(p)
    _send(engine, flood, flood.requests)
    s = Schedule([], [], [])
    while engine.has_work:
        s.sent.append(0 if s.costs else flood.requests)
        _step(engine, s)
    return s


def paced(p: SimProfile, flood: Flood, rate: float, slots: int) -> Schedule:
    """Refills at exactly ``rate`` per step into ``slots``; one not sent for want of a
    free slot is dropped from the schedule, not made up later in a burst."""
    engine: Scheduler[SchedSeq] = Scheduler(p)
    unsent, credit = flood.requests, 0.0
    s = Schedule([], [], [])
    while unsent or engine.has_work:
        credit += rate
        free = slots - len(engine.running) - len(engine.waiting)
        sent = min(int(credit), unsent, max(0, free))
        credit -= int(credit)
        unsent -= sent
        _send(engine, flood, sent)
        s.sent.append(sent)
        _step(engine, s)
    return s


def newcomer_ttft_steps(
    p: SimProfile,
    schedule: Schedule,
    light_prompt_tokens: int,
    hop_ms: float,
    *,
    aligned: bool = True,
    prompt_tokens: int = 0,
    samples: int = 4000,
    seed: int = 0,
) -> list[float]:
    """Newcomers' TTFT over the schedule's mean step, one per arrival drawn uniformly over
    the first 90% of the schedule (its busy part), sorted. Unless ``aligned``, the refills
    of the newcomer's step that reached the engine before it (``prompt_tokens`` each) are
    prefilled with it."""
    ends, t = [], 0.0
    for cost in schedule.costs:
        t += cost
        ends.append(t)
    rng = random.Random(seed)
    out = []
    for _ in range(samples):
        arrived = rng.uniform(0.0, 0.9 * t)
        # The step in progress when it reaches the engine, then its own.
        k = min(bisect.bisect_right(ends, arrived + hop_ms), len(ends) - 1)
        own = p.step_base_ms + p.step_per_seq_ms * schedule.running[k]
        ahead = 0 if aligned else _refills_ahead(schedule, k, ends, arrived + hop_ms, rng)
        own += p.prefill_ms_per_token * (light_prompt_tokens + ahead * prompt_tokens)
        out.append((ends[k] - arrived + own) / schedule.mean_step_ms)
    return sorted(out)


def _refills_ahead(
    schedule: Schedule, k: int, ends: Sequence[float], at_engine: float, rng: random.Random
) -> int:
    """Of the refills prefilled in the step after ``k`` (they reached the engine during
    step ``k``, each at a uniformly drawn moment of it), those that came before a newcomer
    reaching it at ``at_engine``."""
    if k + 1 >= len(schedule.sent):
        return 0
    start = ends[k] - schedule.costs[k]
    share = min(1.0, max(0.0, (at_engine - start) / schedule.costs[k]))
    return sum(rng.random() < share for _ in range(schedule.sent[k + 1]))


def percentile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def table(
    p: SimProfile, flood: Flood, rates: Sequence[float], *, slots: int, light: int, hop_ms: float
) -> str:
    base = fifo(p, flood)
    lines = [
        f"FIFO: {base.total_ms / 1000:.1f} s modeled, {len(base.costs)} steps.",
        "",
        "| refills per step | tok/s vs FIFO | engine steps | mean step ms | "
        "newcomer TTFT p50 / p95 steps, aligned | unaligned |",
        "|---|---|---|---|---|---|",
    ]
    for rate in rates:
        s = paced(p, flood, rate, slots)
        cells = []
        for aligned in (True, False):
            ttft = newcomer_ttft_steps(
                p, s, light, hop_ms, aligned=aligned, prompt_tokens=flood.prompt_tokens
            )
            cells.append(f"{statistics.median(ttft):.2f} / {percentile(ttft, 0.95):.2f}")
        lines.append(
            f"| {rate:g} | {base.total_ms / s.total_ms:.1%} | {len(s.costs)} | "
            f"{s.mean_step_ms:.0f} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


@click.command()
@click.option("--profile", default="h100-8b", show_default=True, help="simulator profile")
@click.option("--requests", default=500, show_default=True, help="the flood's requests")
@click.option("--prompt-tokens", default=1000, show_default=True)
@click.option("--output-tokens", default=200, show_default=True)
@click.option("--kept-slots", default=8, show_default=True, help="batch slots kept for newcomers")
@click.option("--light-prompt-tokens", default=32, show_default=True)
@click.option("--hop-ms", default=6.5, show_default=True,
              help="fairq's queue and hand-over (the seed flood's measured p50s)")  # fmt: skip
@click.option("--rates", default="0.75,0.9,1,1.1,1.25,1.5", show_default=True)
def main(  # noqa: PLR0917 (click passes the options by position)
    profile: str,
    requests: int,
    prompt_tokens: int,
    output_tokens: int,
    kept_slots: int,
    light_prompt_tokens: int,
    hop_ms: float,
    rates: str,
) -> None:
    p = load_profile(profile)
    flood = Flood(requests, prompt_tokens, output_tokens)
    slots = p.max_num_seqs - kept_slots
    click.echo(f"Profile {profile} (estimates); {requests} x {prompt_tokens}-token prompts, "
               f"{output_tokens}-token answers; {slots} slots for the flood.\n")  # fmt: skip
    rates_ = [float(r) for r in rates.split(",")]
    click.echo(table(p, flood, rates_, slots=slots, light=light_prompt_tokens, hop_ms=hop_ms))


if __name__ == "__main__":
    main()
