"""The fairness benchmark's scenarios: who sends what and when, sized to fit the engine.

Each scenario becomes a plan: every request an arm sends, with its user, send time,
prompt and output size. The same plan (seeded) is sent to every arm.

- ``seed``: power user A sends ``power_requests`` requests at t=0; light users B
  and C send one streamed request each at ``light_start_s``, D, E, ... follow one
  every ``light_interval_s``.
- ``long``: as ``seed``, but A streams (a chat user) and each answer's length is
  drawn uniformly (seeded) from a range of long answers: enough of them to fill the
  engine's whole batch before the light users arrive.
- ``mixed``: heavy users A, B, C, ... (one per weight of ``heavy_weights``) stream a
  flood each at t=0, interleaved; the light users' requests arrive at seeded
  Poisson times (mean gap ``light_interval_s``) from ``light_start_s`` on.

Sizes come from a preset per engine family -- ``h100`` for the simulator's h100-8b
profile (256 batch slots, 128k context), ``tiny`` for the real vLLM's tiny model
(8 slots, 512 tokens of context) -- and every size is a flag. ``context_problem``
says why a scenario does not fit an engine's context.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.lib.load import Planned

SCENARIOS = ("seed", "long", "mixed")
FAMILIES = ("h100", "tiny")
LIGHT_PROMPT_TOKENS = 32
# A prompt of N estimated tokens (4 characters each) may be more for a real tokenizer:
# the tiny model's BPE, trained on Python source, splits English words finer.
PROMPT_ESTIMATE_FACTOR = 1.25
TEMPLATE_MARGIN_TOKENS = 16  # the chat template's role markers and special tokens


@dataclass(frozen=True)
class Scenario:
    """One scenario's sizes; ``output_tokens`` is each heavy request's (min, max)."""

    name: str
    power_requests: int  # per heavy user
    prompt_tokens: int
    output_tokens: tuple[int, int]
    power_stream: bool
    heavy_weights: tuple[float, ...] = (1.0,)
    light_users: int = 6
    light_requests: int = 1  # per light user
    light_output_tokens: int = 50
    light_start_s: float = 1.0
    light_interval_s: float = 5.0
    seed: int = 0

    def heavy_users(self) -> dict[str, float]:
        """Heavy user -> its API key's weight: A, B, ... in the order of the weights."""
        return {user_name(i): w for i, w in enumerate(self.heavy_weights)}

    def light_user_names(self) -> list[str]:
        first = len(self.heavy_weights)
        return [user_name(first + i) for i in range(self.light_users)]

    def light_schedule(self) -> list[tuple[str, float]]:
        """(user, seconds after t=0) of every light request, in order of sending."""
        users = self.light_user_names()
        count = self.light_users * self.light_requests
        times = _poisson(self, count) if self.name == "mixed" else _trickle(self, count)
        return [(users[i % len(users)], at) for i, at in enumerate(times)]


def user_name(index: int) -> str:
    return chr(ord("A") + index) if index < 26 else f"U{index}"


def _trickle(s: Scenario, count: int) -> list[float]:
    """The first two together, then one every interval."""
    return [s.light_start_s + max(0, i - 1) * s.light_interval_s for i in range(count)]


def _poisson(s: Scenario, count: int) -> list[float]:
    rng = random.Random(f"{s.seed} arrivals")
    at, times = s.light_start_s, []
    for _ in range(count):
        times.append(round(at, 3))
        at += rng.expovariate(1 / s.light_interval_s) if s.light_interval_s > 0 else 0.0
    return times


def plan(s: Scenario) -> list[Planned]:
    """Every request of the scenario: the heavy floods (interleaved across heavy users,
    so a FIFO engine serves them alike), then the light requests."""
    rng = random.Random(f"{s.seed} outputs")
    low, high = s.output_tokens
    heavy = [
        Planned(user, True, 0.0, s.prompt_tokens, rng.randint(low, high), s.power_stream)
        for _ in range(s.power_requests)
        for user in s.heavy_users()
    ]
    light = [
        Planned(user, False, at, LIGHT_PROMPT_TOKENS, s.light_output_tokens, True)
        for user, at in s.light_schedule()
    ]
    return heavy + light


_H100 = {
    "seed": Scenario("seed", 500, 1000, (200, 200), power_stream=False),
    # 300 streams fill the 256 slots; their prefill takes ~3 s, so light users come after.
    "long": Scenario("long", 300, 200, (1500, 4000), power_stream=True, light_start_s=5.0),
    "mixed": Scenario(
        "mixed",
        300,
        500,
        (200, 200),
        power_stream=True,
        heavy_weights=(1.0, 2.0, 4.0),
        light_requests=2,
        light_interval_s=1.5,
    ),
}
_TINY_LIGHT: dict[str, Any] = {"light_users": 4, "light_output_tokens": 32}
_TINY = {
    "seed": Scenario(
        "seed", 200, 64, (128, 128), power_stream=True, **_TINY_LIGHT, light_interval_s=2.0
    ),
    # Answers that fill the 512-token context: four waves of the 8 slots.
    "long": Scenario(
        "long", 32, 32, (384, 448), power_stream=True, **_TINY_LIGHT, light_interval_s=1.0
    ),
    "mixed": Scenario(
        "mixed",
        100,
        32,
        (96, 96),
        power_stream=True,
        heavy_weights=(1.0, 2.0, 4.0),
        light_requests=2,
        light_interval_s=1.0,
        **_TINY_LIGHT,
    ),
}
PRESETS: dict[str, dict[str, Scenario]] = {"h100": _H100, "tiny": _TINY}

# Flags that apply to some scenarios only; every other size applies to all.
_ONLY = {"long_output_tokens": ("long",), "output_tokens": ("seed", "mixed"),
         "heavy_weights": ("mixed",)}  # fmt: skip


def parse_names(values: Iterable[str]) -> list[str]:
    """Scenario names from repeated and comma-separated values, in order, once each."""
    names = [n.strip().lower() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {','.join(SCENARIOS)}")
    return list(dict.fromkeys(names))


def build(name: str, family: str, flags: Mapping[str, Any]) -> Scenario:
    """The preset of ``family`` with every flag that was given and applies to ``name``."""
    updates: dict[str, Any] = {}
    for key, value in flags.items():
        if value is None or name not in _ONLY.get(key, SCENARIOS):
            continue
        pair = (value, value) if key == "output_tokens" else value
        updates["output_tokens" if key == "long_output_tokens" else key] = pair
    scenario = replace(PRESETS[family][name], **updates)
    validate(scenario)
    return scenario


def validate(s: Scenario) -> None:
    low, high = s.output_tokens
    if min(s.power_requests, s.prompt_tokens, low, s.light_output_tokens) < 1 or high < low:
        raise ValueError(
            f"scenario {s.name}: requests, prompt and output tokens must be >= 1 (min <= max)"
        )
    if s.light_users < 1 or s.light_requests < 1:
        raise ValueError(f"scenario {s.name}: --light-users and --light-requests must be >= 1")
    if not s.heavy_weights or min(s.heavy_weights) <= 0:
        raise ValueError(f"scenario {s.name}: heavy weights must be > 0")
    if s.light_start_s < 0 or s.light_interval_s < 0:
        raise ValueError(f"scenario {s.name}: light times must be >= 0")


def parse_range(text: str) -> tuple[int, int]:
    """``"1500-4000"`` -> (1500, 4000); ``"300"`` -> (300, 300)."""
    low, _, high = text.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError as exc:
        raise ValueError(f"{text!r} is not MIN-MAX tokens") from exc
    return bounds


def parse_weights(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(w) for w in text.split(",") if w.strip())
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a comma list of weights") from exc


def context_needed(prompt_tokens: int, output_tokens: int) -> int:
    """Context one request may need: its prompt (with the tokenizer's slack), its
    output and the chat template's margin."""
    prompt = math.ceil(prompt_tokens * PROMPT_ESTIMATE_FACTOR)
    return prompt + output_tokens + TEMPLATE_MARGIN_TOKENS


def context_problem(s: Scenario, max_model_len: int) -> str | None:
    """Why the scenario's largest request does not fit the engine's context (None: fits)."""
    heavy = context_needed(s.prompt_tokens, s.output_tokens[1])
    light = context_needed(LIGHT_PROMPT_TOKENS, s.light_output_tokens)
    if max(heavy, light) <= max_model_len:
        return None
    which = "heavy" if heavy >= light else "light"
    return (
        f"scenario {s.name}: a {which} request may need {max(heavy, light)} tokens of context "
        f"(prompt x {PROMPT_ESTIMATE_FACTOR} for the tokenizer, + output, "
        f"+ {TEMPLATE_MARGIN_TOKENS} for the chat template), but the engine serves "
        f"max_model_len {max_model_len}: lower --prompt-tokens or the output sizes, "
        "or choose --sizes tiny"
    )


def family_for(names: Iterable[str], max_model_len: int) -> str:
    """The first preset family whose every named scenario fits the context."""
    for family in FAMILIES:
        if all(context_problem(PRESETS[family][n], max_model_len) is None for n in names):
            return family
    return FAMILIES[-1]
