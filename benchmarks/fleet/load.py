"""The fleet benchmark's load: a bounded number of users, each sending one streamed chat
completion at a time through fairq's gateway to a model drawn from a skewed mix (Zipf:
a few hot models, a long tail of cold ones that are often at zero replicas when a
request arrives), with a think time between requests. It stops sending after
``duration_s`` and waits at most ``tail_s`` more for the answers under way.

Each answer is checked whole: exactly ``max_tokens`` content events (the simulator sends
one token per event, so a token repeated or lost changes the count), a usage event that
says as much, one ``[DONE]``, no error event. Times are ``time.monotonic()`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import orjson


@dataclass(frozen=True)
class Mix:
    models: tuple[str, ...]
    weights: tuple[float, ...]

    def pick(self, rng: random.Random) -> str:
        return rng.choices(self.models, self.weights)[0]


def zipf_mix(models: Sequence[str], exponent: float) -> Mix:
    """The i-th model (from 1) drawn with weight 1 / i**exponent."""
    return Mix(tuple(models), tuple(1.0 / (i + 1) ** exponent for i in range(len(models))))


@dataclass
class Request:
    model: str
    user: str
    sent_s: float
    job_id: str | None = None
    first_token_s: float | None = None  # absolute, time.monotonic()
    ended_s: float | None = None
    tokens: int = 0  # content events
    usage_tokens: int | None = None
    done_events: int = 0
    error: str | None = None

    def complete(self, max_tokens: int) -> bool:
        """The whole answer came, once: every token, its usage, one [DONE], no error."""
        return (
            self.error is None
            and self.tokens == max_tokens
            and self.usage_tokens == max_tokens
            and self.done_events == 1
        )


@dataclass(frozen=True)
class LoadShape:
    users: int
    duration_s: float
    think_s: tuple[float, float]
    max_tokens: int
    tail_s: float  # the longest wait for answers under way once sending stops
    seed: int


@dataclass
class LoadRun:
    requests: list[Request] = field(default_factory=list)
    began_s: float = 0.0
    ended_s: float = 0.0


async def run_load(url: str, key: str, mix: Mix, shape: LoadShape) -> LoadRun:
    """Every user's requests, one at a time each, until ``duration_s``; then the answers
    under way, for at most ``tail_s`` (those cut there count as lost)."""
    run = LoadRun(began_s=time.monotonic())
    until = run.began_s + shape.duration_s
    limits = httpx.Limits(max_connections=shape.users + 4)
    timeout = httpx.Timeout(shape.duration_s + shape.tail_s, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        users = [_user(client, url, key, mix, shape, i, until, run) for i in range(shape.users)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*users), shape.duration_s + shape.tail_s)
    run.ended_s = time.monotonic()
    return run


async def _user(  # noqa: PLR0917 (one user's whole context)
    client: httpx.AsyncClient,
    url: str,
    key: str,
    mix: Mix,
    shape: LoadShape,
    index: int,
    until: float,
    run: LoadRun,
) -> None:
    rng = random.Random(f"{shape.seed}-{index}")
    user = f"user-{index:03d}"
    await asyncio.sleep(rng.uniform(0, shape.think_s[1]))  # users do not all start at once
    while time.monotonic() < until:
        request = Request(mix.pick(rng), user, time.monotonic())
        run.requests.append(request)
        await _send(client, url, key, request, shape.max_tokens)
        await asyncio.sleep(rng.uniform(*shape.think_s))


async def _send(
    client: httpx.AsyncClient, url: str, key: str, request: Request, max_tokens: int
) -> None:
    body = {"model": request.model, "messages": [{"role": "user", "content": "hello fleet"}],
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
            "user": request.user}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        async with client.stream("POST", url, content=orjson.dumps(body), headers=headers) as r:
            request.job_id = r.headers.get("x-fairq-job-id")
            if r.status_code != 200:
                request.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for line in r.aiter_lines():
                _read_line(request, line)
    except httpx.HTTPError as exc:
        request.error = f"{type(exc).__name__}: {exc}"
    finally:
        request.ended_s = time.monotonic()


def _read_line(request: Request, line: str) -> None:
    if not line.startswith("data: "):
        return
    data = line[6:]
    if data == "[DONE]":
        request.done_events += 1
        return
    event = orjson.loads(data)
    if "error" in event:
        request.error = f"error event: {str(event['error'])[:200]}"
    choices = event.get("choices") or []
    if choices and (choices[0].get("delta") or {}).get("content"):
        request.tokens += 1
        if request.first_token_s is None:
            request.first_token_s = time.monotonic()
    usage = event.get("usage")
    if isinstance(usage, dict) and "completion_tokens" in usage:
        request.usage_tokens = int(usage["completion_tokens"])
