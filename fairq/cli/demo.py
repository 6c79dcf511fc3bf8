"""``fairq demo newcomer``: the case fairq exists for, against a running ``fairq up``.

alice floods a model with long streamed answers (by default 100 requests of 1,500
tokens: the engine's whole batch, and a queue behind it in fairq). Once her requests
stop starting (the batch is full), bob sends one request. The demo prints bob's time to
first token and the ``estimated_wait_s`` his job showed while he waited (``GET
/v1/jobs/{id}`` with his key, polled until his first token), then cancels alice's
requests (``DELETE /v1/jobs/{id}``) so the engine is free again.

It talks to the gateway as any OpenAI-compatible client would, over plain HTTP (httpx,
which fairq needs anyway: the demo runs right after ``make run``, without the ``openai``
package): streamed chat completions read as server-sent events, the job id from the
``X-Fairq-Job-Id`` header (``X-Fairq-Stream-Headers: early`` has it sent while the job
is queued, not with the first token), and the job routes, which OpenAI's API lacks.
alice's streams are read as bytes, unparsed: the demo shares the machine with the stack,
and parsing her 150,000 chunks would take CPU from the engine bob is measured on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

JOB_HEADER = "X-Fairq-Job-Id"
_EARLY = {"X-Fairq-Stream-Headers": "early"}  # the job id before the first token
_POLL_S = 0.01  # bob's job is read this often while he waits
_SETTLED_S = 0.5  # alice's batch is full once none of her requests started for this long
_FILL_TIMEOUT_S = 60.0
_PROMPT = [{"role": "user", "content": "Tell me about queues."}]
# An answer of 1,500 tokens streams for minutes; the openai client's own bounds.
_STREAM_TIMEOUT = httpx.Timeout(600.0, connect=5.0)


@dataclass(frozen=True)
class Seen:
    """One look at bob's job while he waited."""

    after_s: float  # since bob sent his request
    status: str
    jobs_ahead: int | None  # None: not queued (no queue_position)
    estimated_wait_s: float | None


@dataclass
class NewcomerRun:
    """What the demo measured."""

    alice_jobs: list[str] = field(default_factory=list)
    alice_streaming: int = 0  # her requests with output when bob sent his
    alice_last: Seen | None = None  # her last job still queued when bob sent his
    bob_job: str | None = None
    bob_ttft_s: float | None = None
    bob_seen: list[Seen] = field(default_factory=list)
    alice_cancelled: int = 0  # of her jobs still running or queued at the end

    @property
    def bob_waits(self) -> list[float | None]:
        """The estimated_wait_s values bob's job showed while queued."""
        return [s.estimated_wait_s for s in self.bob_seen if s.jobs_ahead is not None]


@dataclass(frozen=True)
class Flood:
    model: str = "demo-chat"
    requests: int = 100
    max_tokens: int = 1500
    bob_max_tokens: int = 20


async def newcomer(
    base_url: str,
    alice_key: str,
    bob_key: str,
    flood: Flood | None = None,
    say: Callable[[str], None] = print,
) -> NewcomerRun:
    """Flood as alice, then time bob's first token; alice's requests are cancelled at the
    end, whatever happened."""
    flood = flood or Flood()
    run = NewcomerRun()
    async with (
        _client(base_url, alice_key) as alice,
        _client(base_url, bob_key) as bob,
        httpx.AsyncClient(base_url=base_url, timeout=10.0) as http,
    ):
        started: list[float] = []
        say(
            f"alice: {flood.requests} streamed requests of {flood.max_tokens} tokens "
            f"to {flood.model}"
        )
        floods = [
            asyncio.create_task(_alice_request(alice, flood, run.alice_jobs, started))
            for _ in range(flood.requests)
        ]
        try:
            await _until_full(run, flood.requests, started)
            run.alice_streaming = len(started)
            run.alice_last = await _last_queued(http, alice_key, run.alice_jobs)
            say(
                f"alice: {run.alice_streaming} answers streaming, "
                f"{flood.requests - run.alice_streaming} waiting"
            )
            say(f"alice: {_describe('her last queued job', run.alice_last)}")
            await _bob(bob, http, (bob_key, flood.model, flood.bob_max_tokens), run, say)
        finally:
            run.alice_cancelled = await _cancel(http, alice_key, run.alice_jobs)
            for task in floods:
                task.cancel()
            await asyncio.gather(*floods, return_exceptions=True)
        say(
            f"alice: {run.alice_cancelled} of her {len(run.alice_jobs)} jobs cancelled "
            "(the others had ended)"
        )
    return run


def _client(base_url: str, key: str) -> httpx.AsyncClient:
    """One user's client of the completions: each of alice's requests its own connection
    (httpx's default pool of 100 would queue her 101st in the demo, not in fairq)."""
    return httpx.AsyncClient(
        base_url=f"{base_url}/v1",
        headers={**_auth(key), **_EARLY},
        timeout=_STREAM_TIMEOUT,
        limits=httpx.Limits(max_connections=None),
    )


@contextlib.asynccontextmanager
async def _stream(
    client: httpx.AsyncClient, model: str, max_tokens: int
) -> AsyncIterator[httpx.Response]:
    """A streamed chat completion's response, once its headers came with a 200 (else
    ``httpx.HTTPStatusError`` with the gateway's own message)."""
    body = {"model": model, "messages": _PROMPT, "stream": True, "max_tokens": max_tokens}
    async with client.stream("POST", "/chat/completions", json=body) as response:
        if response.status_code != httpx.codes.OK:
            await response.aread()
            message = _error_message(response.text) or response.reason_phrase
            raise httpx.HTTPStatusError(
                f"{response.status_code} {message}", request=response.request, response=response
            )
        yield response


def _error_message(text: str) -> str | None:
    """The message of an OpenAI error object, if ``text`` is one."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return None


async def _alice_request(
    client: httpx.AsyncClient, flood: Flood, jobs: list[str], started: list[float]
) -> None:
    async with _stream(client, flood.model, flood.max_tokens) as response:
        jobs.append(response.headers[JOB_HEADER])
        first = True
        async for piece in response.aiter_bytes():
            if first and b"data:" in piece:  # the first event comes with the first token
                started.append(time.monotonic())  # (a heartbeat is a comment line)
                first = False


async def _until_full(run: NewcomerRun, requests: int, started: list[float]) -> None:
    """Until every request of alice is queued and none started for ``_SETTLED_S``."""
    deadline = time.monotonic() + _FILL_TIMEOUT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        queued = len(run.alice_jobs) == requests
        if queued and started and time.monotonic() - max(started) >= _SETTLED_S:
            return
    raise TimeoutError(f"alice's requests did not settle within {_FILL_TIMEOUT_S:g} s")


async def _bob(
    client: httpx.AsyncClient,
    http: httpx.AsyncClient,
    request: tuple[str, str, int],  # bob's key, the model, max_tokens
    run: NewcomerRun,
    say: Callable[[str], None],
) -> None:
    key, model, max_tokens = request
    say("bob: sends one streamed request")
    sent = time.monotonic()
    async with _stream(client, model, max_tokens) as response:
        run.bob_job = response.headers[JOB_HEADER]
        watcher = asyncio.create_task(_watch(http, key, run.bob_job, sent, run.bob_seen))
        try:
            async for content in _contents(response):  # to its end: his job completes
                if run.bob_ttft_s is None and content:
                    run.bob_ttft_s = time.monotonic() - sent
                    watcher.cancel()  # he waits no more
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    for seen in run.bob_seen:
        say(f"bob: {_describe(f'+{seen.after_s * 1000:.0f} ms', seen)}")
    ttft = "none" if run.bob_ttft_s is None else f"{run.bob_ttft_s:.3f} s"
    say(f"bob: first token after {ttft}")
    say(f"bob: estimated_wait_s while he waited: {_waits(run)}")


async def _contents(response: httpx.Response) -> AsyncIterator[str]:
    """The text of each chunk of a streamed chat completion, as its events come (an
    error event raises, as the openai client's stream does)."""
    async for line in response.aiter_lines():
        if not line.startswith("data:") or line == "data: [DONE]":
            continue  # a heartbeat (a comment line), a blank line, the end
        chunk = json.loads(line.removeprefix("data:"))
        if "error" in chunk:
            raise RuntimeError(f"the stream ended with an error: {chunk['error'].get('message')}")
        for choice in chunk.get("choices") or ():
            yield (choice.get("delta") or {}).get("content") or ""


async def _watch(
    http: httpx.AsyncClient, key: str, job_id: str, sent: float, seen: list[Seen]
) -> None:
    """Look at bob's job until cancelled (his first token); keep each change."""
    while True:
        look = await _look(http, key, job_id, time.monotonic() - sent)
        if not seen or (look.status, look.estimated_wait_s) != (
            seen[-1].status,
            seen[-1].estimated_wait_s,
        ):
            seen.append(look)
        await asyncio.sleep(_POLL_S)


async def _look(http: httpx.AsyncClient, key: str, job_id: str, after_s: float) -> Seen:
    response = await http.get(f"/v1/jobs/{job_id}", headers=_auth(key))
    response.raise_for_status()
    job: dict[str, Any] = response.json()
    position = job.get("queue_position") or {}
    return Seen(
        after_s, job["status"], position.get("jobs_ahead"), position.get("estimated_wait_s")
    )


async def _last_queued(http: httpx.AsyncClient, key: str, jobs: list[str]) -> Seen | None:
    """The last of ``jobs`` (in the order their answers began) that is still queued."""
    for job_id in reversed(jobs):
        seen = await _look(http, key, job_id, 0.0)
        if seen.jobs_ahead is not None:
            return seen
    return None


def _describe(who: str, seen: Seen | None) -> str:
    if seen is None:
        return f"{who}: none queued"
    if seen.jobs_ahead is None:
        return f"{who}: {seen.status}"
    return (
        f"{who}: {seen.status}, {seen.jobs_ahead} jobs ahead, "
        f"estimated_wait_s {seen.estimated_wait_s}"
    )


def _waits(run: NewcomerRun) -> str:
    if run.bob_waits:
        return ", ".join(str(w) for w in run.bob_waits)
    first = run.bob_seen[0] if run.bob_seen else None
    when = f" (first look +{first.after_s * 1000:.0f} ms: {first.status})" if first else ""
    return f"none: his job had left the queue before it was first looked at{when}"


async def _cancel(http: httpx.AsyncClient, key: str, jobs: list[str]) -> int:
    """Cancel every job of ``jobs`` not ended yet; returns how many this cancelled."""

    async def cancel(job_id: str) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            response = await http.delete(f"/v1/jobs/{job_id}", headers=_auth(key))
            return (
                response.status_code == httpx.codes.OK and response.json()["status"] == "cancelled"
            )
        return False

    return sum(await asyncio.gather(*(cancel(j) for j in list(jobs))))


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
