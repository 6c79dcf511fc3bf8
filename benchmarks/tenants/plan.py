"""The tenants harness's plans: who sends what, when, and in which class (pure, no I/O).

The interactive tail (``tail``): a steady interactive stream, Poisson arrivals spread
over ``interactive_users`` users, sent alone first (the no-flood baseline), then again,
the same requests at the same times, while one power user floods the engine at t=0
and a batch tenant's lines arrive at t=0 too (through the Batch API where the arm is
fairq, as plain requests elsewhere). Every arm gets the same seeded plan.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.lib.load import Planned

INTERACTIVE = "interactive"
POWER = "power"  # the flood: one user's requests at t=0, the default band
BATCH = "batch"  # the Batch API's lines, the lowest band
POWER_USER = "P"
BATCH_USER = "Q"


@dataclass(frozen=True)
class TailSizes:
    """The interactive tail's sizes; the defaults fit the simulator's h100-8b profile
    at 32 slots (``PRESETS``)."""

    interactive_requests: int = 1000
    rate_per_s: float = 12.0  # about half the batch running, alone
    interactive_users: int = 50
    prompt_tokens: int = 512
    output_tokens: int = 128
    power_requests: int = 400
    power_output_tokens: int = 512
    batch_lines: int = 300
    batch_output_tokens: int = 256
    seed: int = 0


# The sizes per engine family: the simulator's h100-8b profile at 32 slots, and the real
# vLLM's tiny model at 8 slots with 512 tokens of context (its answers ~3 ms a token).
PRESETS = {
    "h100": TailSizes(),
    "tiny": TailSizes(
        rate_per_s=25.0,
        interactive_users=20,
        prompt_tokens=64,
        output_tokens=32,
        power_requests=300,
        power_output_tokens=256,
        batch_lines=200,
        batch_output_tokens=128,
    ),
}


@dataclass(frozen=True)
class Sent:
    """One request of a plan with its class (``Planned`` is what the load sends)."""

    klass: str
    planned: Planned


def interactive_stream(s: TailSizes) -> list[Sent]:
    """The interactive requests: Poisson arrivals at ``rate_per_s`` from t=0, each from
    the next of ``interactive_users`` users in turn."""
    rng = random.Random(f"{s.seed} interactive")
    at, out = 0.0, []
    for i in range(s.interactive_requests):
        user = f"i{i % s.interactive_users:03d}"
        out.append(
            Sent(
                INTERACTIVE, Planned(user, False, at, s.prompt_tokens, s.output_tokens, stream=True)
            )
        )
        at += rng.expovariate(s.rate_per_s)
    return out


def flood(s: TailSizes) -> list[Sent]:
    """The power user's requests at t=0 (streamed, as a chat client's)."""
    return [
        Sent(
            POWER,
            Planned(POWER_USER, True, 0.0, s.prompt_tokens, s.power_output_tokens, stream=True),
        )
        for _ in range(s.power_requests)
    ]


def batch_lines(s: TailSizes) -> list[Sent]:
    """The batch tenant's lines, all at t=0: one Batch API file where the arm is fairq,
    requests not streamed elsewhere."""
    return [
        Sent(
            BATCH,
            Planned(BATCH_USER, True, 0.0, s.prompt_tokens, s.batch_output_tokens, stream=False),
        )
        for _ in range(s.batch_lines)
    ]


def stream_span_s(s: TailSizes) -> float:
    """When the interactive stream's last request is sent."""
    return interactive_stream(s)[-1].planned.at_s if s.interactive_requests else 0.0
