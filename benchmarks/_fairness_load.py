"""The fairness benchmark's load: one power user's flood and a few light users.

Power user A sends ``power_requests`` non-streamed requests all at once at
t=0. Light users B and C send one streamed request each at ``light_start_s``;
D, E, ... follow one at a time every ``light_interval_s``. Every request goes
to one ``Target``: the engine itself (direct arms) or fairq's gateway, where
each user has an API key of their own.

Measured: each light request's arrival and time to first token (the first
chunk with content), every response's output tokens (from ``usage``), and when
the last power response came. Everything is bounded by a deadline, and a dead
stack process ends the load early instead of leaving it to time out.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

POWER_USER = "A"
CHARS_PER_TOKEN = 4  # the simulator's estimate; a real tokenizer is in the same range
CHAT_OVERHEAD_TOKENS = 4  # role markers a chat template adds around one message
LIGHT_PROMPT_TOKENS = 32
_WORDS = [
    "queue",
    "engine",
    "token",
    "batch",
    "user",
    "fair",
    "request",
    "latency",
    "model",
    "cache",
    "prefill",
    "decode",
    "priority",
    "stream",
    "worker",
    "budget",
    "schedule",
    "memory",
    "answer",
    "question",
    "system",
    "prompt",
]


@dataclass(frozen=True)
class Scenario:
    """The sizes of the seed scenario; every one is a flag of the benchmark."""

    power_requests: int = 500
    prompt_tokens: int = 1000
    output_tokens: int = 200
    light_users: int = 6
    light_output_tokens: int = 50
    light_start_s: float = 1.0
    light_interval_s: float = 5.0

    def light_schedule(self) -> list[tuple[str, float]]:
        """(user, seconds after t=0): B and C together, then one every interval."""
        users = [light_user_name(i) for i in range(self.light_users)]
        return [
            (user, self.light_start_s + max(0, i - 1) * self.light_interval_s)
            for i, user in enumerate(users)
        ]


def light_user_name(index: int) -> str:
    return chr(ord("B") + index) if index < 25 else f"L{index}"


@dataclass(frozen=True)
class Target:
    """Where one arm sends its requests, and how each user is named there."""

    url: str  # the chat completions URL
    model: str
    keys: Mapping[str, str] | None = None  # user -> API key (fairq); None: direct
    priorities: bool = False  # set vLLM's `priority`: 0 for light users, 1 for the power user

    def headers(self, user: str) -> dict[str, str]:
        return {} if self.keys is None else {"Authorization": f"Bearer {self.keys[user]}"}

    def body(self, user: str, prompt: str, max_tokens: int, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "ignore_eos": True,  # vLLM: produce exactly max_tokens (the simulator always does)
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.priorities:
            body["priority"] = 1 if user == POWER_USER else 0
        return body


@dataclass
class LightRequest:
    user: str
    arrival_s: float  # sent, seconds after t=0
    ttft_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    error: str | None = None


@dataclass
class LoadResult:
    light: list[LightRequest]
    power_done_s: float | None  # the last power response, seconds after t=0
    power_ok: int
    power_errors: int
    output_tokens: int  # over every response of the arm
    wall_s: float  # t=0 to the last response
    errors: list[str] = field(default_factory=list)  # the first few, to say what went wrong

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


def make_prompt(tag: str, tokens: int, rng: random.Random) -> str:
    """About ``tokens`` prompt tokens (chat overhead included), unique per ``tag``: a
    real vLLM caches shared prefixes, and identical prompts would skip their prefill."""
    chars = max(1, tokens - CHAT_OVERHEAD_TOKENS) * CHARS_PER_TOKEN
    text = f"[{tag}] "
    while len(text) < chars:
        text += rng.choice(_WORDS) + " "
    return text[:chars]


@dataclass
class _PowerDone:
    end_s: float
    tokens: int = 0
    error: str | None = None


async def _power_request(
    client: httpx.AsyncClient, target: Target, prompt: str, tokens: int, t0: float
) -> _PowerDone:
    body = target.body(POWER_USER, prompt, tokens, stream=False)
    try:
        response = await client.post(target.url, json=body, headers=target.headers(POWER_USER))
    except httpx.HTTPError as exc:
        return _PowerDone(time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter() - t0
    if response.status_code != 200:
        return _PowerDone(end, error=f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        usage = orjson.loads(response.content).get("usage") or {}
        return _PowerDone(end, int(usage["completion_tokens"]))
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return _PowerDone(end, error=f"no usage in the answer: {response.text[:200]}")


async def light_request(
    client: httpx.AsyncClient, target: Target, user: str, *, prompt: str, tokens: int, t0: float
) -> LightRequest:
    """One streamed request; TTFT is when the first chunk with content arrives."""
    start = time.perf_counter()
    result = LightRequest(user, start - t0)
    body = target.body(user, prompt, tokens, stream=True)
    try:
        async with client.stream(
            "POST", target.url, json=body, headers=target.headers(user)
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                result.error = f"HTTP {response.status_code}: {text}"
                return result
            async for line in response.aiter_lines():
                _read_event(line, result, start)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.end_s = time.perf_counter() - t0
    if result.ttft_s is None:
        result.error = "the stream ended without content"
    return result


def _read_event(line: str, result: LightRequest, start: float) -> None:
    if not line.startswith("data: {"):
        return
    chunk = orjson.loads(line[6:])
    choices = chunk.get("choices")
    if choices and choices[0].get("delta", {}).get("content") and result.ttft_s is None:
        result.ttft_s = time.perf_counter() - start
    usage = chunk.get("usage")
    if not choices and isinstance(usage, dict):
        result.output_tokens = int(usage.get("completion_tokens", 0))


async def _light_at(
    client: httpx.AsyncClient, target: Target, user: str, *, at_s: float, tokens: int, t0: float
) -> LightRequest:
    await asyncio.sleep(max(0.0, t0 + at_s - time.perf_counter()))
    prompt = make_prompt(f"light {user}", LIGHT_PROMPT_TOKENS, random.Random(user))
    return await light_request(client, target, user, prompt=prompt, tokens=tokens, t0=t0)


async def run_load(
    target: Target,
    scenario: Scenario,
    deadline_s: float,
    dead: Callable[[], str | None] = lambda: None,
    on_start: Callable[[float], None] = lambda _t0: None,
) -> LoadResult:
    """Run the scenario once; requests still open at the deadline count as errors."""
    rng = random.Random(0)
    prompts = [
        make_prompt(f"A {i}", scenario.prompt_tokens, rng) for i in range(scenario.power_requests)
    ]
    connections = scenario.power_requests + scenario.light_users + 8
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    timeout = httpx.Timeout(deadline_s, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()
        on_start(t0)
        power = [
            asyncio.create_task(_power_request(client, target, p, scenario.output_tokens, t0))
            for p in prompts
        ]
        light = [
            asyncio.create_task(
                _light_at(client, target, user, at_s=at, tokens=scenario.light_output_tokens, t0=t0)
            )
            for user, at in scenario.light_schedule()
        ]
        stopped = await _wait_all([*power, *light], t0 + deadline_s, dead)
    return _collect(power, light, scenario, t0, stopped)


async def _wait_all(
    tasks: list[asyncio.Task[Any]], deadline: float, dead: Callable[[], str | None]
) -> str | None:
    """Wait for every task until the deadline or a dead stack process; cancel the rest
    and say why they were stopped (None when all finished)."""
    pending: set[asyncio.Task[Any]] = set(tasks)
    reason = None
    while pending:
        left = deadline - time.perf_counter()
        if left <= 0:
            reason = "deadline reached"
        elif (name := dead()) is not None:
            reason = f"stack process {name} exited"
        if reason is not None:
            break
        _, pending = await asyncio.wait(pending, timeout=min(1.0, left))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return reason


def _collect(
    power: list[asyncio.Task[_PowerDone]],
    light: list[asyncio.Task[LightRequest]],
    scenario: Scenario,
    t0: float,
    stopped: str | None,
) -> LoadResult:
    now = time.perf_counter() - t0
    done = [t.result() for t in power if not t.cancelled()]
    lights = [
        t.result() if not t.cancelled() else LightRequest(user, at, error=f"stopped: {stopped}")
        for t, (user, at) in zip(light, scenario.light_schedule(), strict=True)
    ]
    ok = [d for d in done if d.error is None]
    errors = [d.error for d in done if d.error] + [r.error for r in lights if r.error]
    if stopped is not None:
        errors.insert(0, f"stopped: {stopped}")
    ends = [d.end_s for d in done] + [r.end_s for r in lights if r.end_s is not None]
    return LoadResult(
        light=lights,
        power_done_s=None if stopped else max((d.end_s for d in done), default=None),
        power_ok=len(ok),
        power_errors=len(power) - len(ok),
        output_tokens=sum(d.tokens for d in ok) + sum(r.output_tokens for r in lights),
        wall_s=max(ends, default=now),
        errors=errors[:5],
    )
