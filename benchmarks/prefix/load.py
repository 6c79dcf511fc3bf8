"""The prefix benchmark's loads: conversations whose prompts grow turn by turn.

A session is one user's conversation, sent through one trusted app key that names
the user with OpenAI's ``user`` field (as a chat app or an agent framework does).
Each turn sends the whole conversation so far and waits for the streamed answer,
then pauses before the next turn: so a session's prompts share ever longer
prefixes, and every session shares the system prompt of its load.

* ``chat``: many users, a shared system prompt, a short message per turn, think
  time of a second or two between turns.
* ``agent``: fewer sessions, each step appends a long tool result to the context,
  short pauses between steps: the context grows to thousands of tokens.
* ``oneshot``: the control: every request a new prompt that shares nothing (no
  system prompt, no earlier turn), so routing can gain nothing from a cache.

The text is made of random words from a seeded generator, so every run sends the
same bytes; an assistant turn is replaced by text of the answer's length (the
simulator caches prompt blocks only, so the next turn need not repeat the answer's
exact words). Everything is bounded: a fixed number of turns and a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from benchmarks.lib.sse import StreamTally

CHARS_PER_TOKEN = 4  # the simulator's estimate
_WORDS = ("queue", "engine", "token", "batch", "user", "fair", "request", "latency", "model",
          "cache", "prefill", "decode", "priority", "stream", "worker", "budget", "schedule",
          "memory", "answer", "question", "system", "prompt", "replica", "route")  # fmt: skip


@dataclass(frozen=True)
class LoadShape:
    """One load: how many sessions, how long each, and how big each turn's parts are."""

    name: str
    sessions: int
    turns: int
    system_tokens: int  # shared by every session of the load
    first_tokens: int  # the session's opening message (its own prefix)
    turn_tokens: int  # what each later turn adds (a user message or a tool result)
    output_tokens: int
    pause_s: tuple[float, float]  # uniform between turns
    start_spread_s: float  # sessions start uniformly within this
    grows: bool = True  # False: each turn a fresh prompt that shares nothing


def chat(sessions: int = 32, turns: int = 5) -> LoadShape:
    return LoadShape("chat", sessions, turns, system_tokens=1500, first_tokens=200,
                     turn_tokens=120, output_tokens=64, pause_s=(0.5, 1.5),
                     start_spread_s=2.0)  # fmt: skip


def agent(sessions: int = 12, turns: int = 10) -> LoadShape:
    return LoadShape("agent", sessions, turns, system_tokens=2000, first_tokens=300,
                     turn_tokens=800, output_tokens=48, pause_s=(0.05, 0.2),
                     start_spread_s=1.0)  # fmt: skip


def oneshot(sessions: int = 16, turns: int = 6) -> LoadShape:
    return LoadShape("oneshot", sessions, turns, system_tokens=0, first_tokens=1500,
                     turn_tokens=0, output_tokens=64, pause_s=(0.2, 0.6),
                     start_spread_s=1.0, grows=False)  # fmt: skip


def words(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of text (at CHARS_PER_TOKEN characters each)."""
    out: list[str] = []
    size = 0
    while size < tokens * CHARS_PER_TOKEN:
        word = rng.choice(_WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


@dataclass
class Session:
    """One conversation: its messages so far grow with every turn."""

    user: str
    messages: list[dict[str, str]]
    rng: random.Random

    def next_turn(self, shape: LoadShape) -> None:
        """The answer (as text of its length) and the next message."""
        if not shape.grows:
            self.messages = [{"role": "user", "content": words(self.rng, shape.first_tokens)}]
            return
        self.messages.append({"role": "assistant", "content": words(self.rng, shape.output_tokens)})
        # An agent's tool result goes back as a user message (a ReAct observation).
        self.messages.append({"role": "user", "content": words(self.rng, shape.turn_tokens)})


def sessions(shape: LoadShape, seed: int) -> list[Session]:
    system = words(random.Random(seed), shape.system_tokens)
    out = []
    for index in range(shape.sessions):
        rng = random.Random(f"{seed}-{shape.name}-{index}")
        opening = words(rng, shape.first_tokens)
        messages = [{"role": "user", "content": opening}]
        if shape.system_tokens:
            messages.insert(0, {"role": "system", "content": system})
        out.append(Session(f"{shape.name}-{index:03d}", messages, rng))
    return out


@dataclass
class Turn:
    """One request's outcome; times in seconds."""

    user: str
    turn: int
    prompt_chars: int
    sent_s: float
    ttft_s: float | None = None
    tokens: int = 0
    error: str | None = None


@dataclass
class LoadRun:
    turns: list[Turn] = field(default_factory=list)
    wall_s: float = 0.0


async def run_load(
    url: str, key: str, model: str, shape: LoadShape, *, seed: int, deadline_s: float
) -> LoadRun:
    """Every session's turns in order, the sessions at once, until done or the deadline."""
    run = LoadRun()
    origin = time.monotonic()
    limits = httpx.Limits(max_connections=shape.sessions + 4)
    timeout = httpx.Timeout(deadline_s, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        tasks = [
            _session(client, url, key, model, shape, s, origin, run) for s in sessions(shape, seed)
        ]
        # At the deadline the turns not ended count as failed (no first token or usage).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks), deadline_s)
    run.wall_s = time.monotonic() - origin
    return run


async def _session(  # noqa: PLR0917 (one conversation's whole context)
    client: httpx.AsyncClient,
    url: str,
    key: str,
    model: str,
    shape: LoadShape,
    session: Session,
    origin: float,
    run: LoadRun,
) -> None:
    await asyncio.sleep(session.rng.uniform(0, shape.start_spread_s))
    for index in range(shape.turns):
        if index:
            session.next_turn(shape)
            await asyncio.sleep(session.rng.uniform(*shape.pause_s))
        turn = Turn(session.user, index, sum(len(m["content"]) for m in session.messages),
                    time.monotonic() - origin)  # fmt: skip
        run.turns.append(turn)
        await _send(client, url, key, _body(model, shape, session), turn, origin)
        if turn.error is not None:
            return  # a conversation does not go on past a failed turn


def _body(model: str, shape: LoadShape, session: Session) -> dict[str, Any]:
    return {
        "model": model,
        "messages": session.messages,
        "max_tokens": shape.output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": session.user,
    }


async def _send(  # noqa: PLR0917 (one request's whole context)
    client: httpx.AsyncClient,
    url: str,
    key: str,
    body: dict[str, Any],
    turn: Turn,
    origin: float,
) -> None:
    tally = StreamTally(origin + turn.sent_s)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        async with client.stream("POST", url, content=orjson.dumps(body), headers=headers) as r:
            if r.status_code != 200:
                turn.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            async for data in r.aiter_raw():
                tally.feed(data, time.monotonic())
    except httpx.HTTPError as exc:
        turn.error = f"{type(exc).__name__}: {exc}"
        return
    turn.ttft_s = tally.first_token_s
    turn.tokens = tally.usage_tokens() or 0
    if tally.tail_error() is not None:
        turn.error = tally.tail_error()
    elif turn.ttft_s is None or turn.tokens < int(body["max_tokens"]):
        turn.error = f"incomplete answer: {turn.tokens} of {body['max_tokens']} tokens"
