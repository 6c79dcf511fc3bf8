"""The fairness benchmark's load: send a scenario's plan to one target and time it.

Every planned request (``benchmarks.fairness.scenarios.plan``) is sent at its time to one
``Target``: the engine itself (direct arms) or fairq's gateway, where each user
has an API key of their own, over the worker's engine client
(``workers.engine_http``: httptools inside the protocol, a piece of body per callback;
the load client shares the cores with what it measures). Streamed answers are read by
``StreamTally``.

Measured per request: when it was sent, its first token (streams), its end, its
output tokens (from ``usage``), a light stream's reads (for its inter-token latencies)
and, when asked, its tokens over time. A request
fails when it gets an error, an answer without usage, fewer tokens than it asked
for (``ignore_eos`` makes the engine produce exactly ``max_tokens``), or is still
open at the deadline. Everything is bounded by that deadline, and a dead stack
process ends the load early instead of leaving it to time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from benchmarks.lib.sse import StreamTally
from workers.engine_http import EngineClient, HttpClientError, Reply

CHARS_PER_TOKEN = 4  # the simulator's estimate; a real tokenizer is in the same range
CHAT_OVERHEAD_TOKENS = 4  # role markers a chat template adds around one message
_WORDS = ("queue", "engine", "token", "batch", "user", "fair", "request", "latency", "model",
          "cache", "prefill", "decode", "priority", "stream", "worker", "budget", "schedule",
          "memory", "answer", "question", "system", "prompt")  # fmt: skip


@dataclass(frozen=True)
class Planned:
    """One request of the plan."""

    user: str
    heavy: bool
    at_s: float  # when it is sent, seconds after t=0
    prompt_tokens: int
    max_tokens: int
    stream: bool


@dataclass(frozen=True)
class Target:
    """Where one arm sends its requests, and how each user is named there."""

    url: str  # the chat completions URL
    model: str
    keys: Mapping[str, str] | None = None  # user -> API key (fairq); None: direct
    priorities: bool = False  # set vLLM's `priority`: 0 for light users, 1 for heavy ones
    token_ids: bool = False  # ask for the token ids (vLLM's `return_token_ids`)

    def headers(self, user: str) -> dict[str, str]:
        return {} if self.keys is None else {"Authorization": f"Bearer {self.keys[user]}"}

    def body(self, prompt: str, max_tokens: int, *, stream: bool, heavy: bool) -> dict[str, Any]:
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
            body["priority"] = 1 if heavy else 0
        if self.token_ids:
            body["return_token_ids"] = True
        return body


@dataclass
class RequestResult:
    user: str
    heavy: bool
    arrival_s: float  # sent, seconds after t=0
    max_tokens: int
    ttft_s: float | None = None  # after arrival (streams only)
    first_token_s: float | None = None  # after t=0
    end_s: float | None = None
    output_tokens: int = 0
    buckets: dict[int, int] = field(default_factory=dict)  # time bucket -> events
    error: str | None = None
    # A light request's stream reads from its first token on: (s after t=0, events in it)
    reads: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class LoadResult:
    requests: list[RequestResult]
    wall_s: float  # t=0 to the last response
    stopped: str | None = None  # why the load was cut short (None: every request ended)
    bucket_s: float | None = None

    @property
    def light(self) -> list[RequestResult]:
        return [r for r in self.requests if not r.heavy]

    @property
    def failed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.error is not None]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests if r.error is None)

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def heavy_done_s(self) -> float | None:
        """When the heavy users' last answer came (None: cut short)."""
        ends = [r.end_s for r in self.requests if r.heavy and r.end_s is not None]
        return None if self.stopped or not ends else max(ends)


def make_prompt(tag: str, tokens: int, rng: random.Random) -> str:
    """About ``tokens`` prompt tokens (chat overhead included), unique per ``tag``: a
    real vLLM caches shared prefixes, and identical prompts would skip their prefill."""
    chars = max(1, tokens - CHAT_OVERHEAD_TOKENS) * CHARS_PER_TOKEN
    words = [f"[{tag}]"]
    length = len(words[0])
    while length < chars:
        words.append(rng.choice(_WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)[:chars]


def _done(result: RequestResult, tokens: int | None, t0: float) -> None:
    result.end_s = time.perf_counter() - t0
    if tokens is None:
        result.error = result.error or "the answer carried no usage"
    elif tokens < result.max_tokens:
        result.error = f"the answer was cut: {tokens} of {result.max_tokens} tokens"
    else:
        result.output_tokens = tokens


CONNECT_TIMEOUT_S = 30.0
# No silence bound of its own: a FIFO engine leaves a flood's last requests silent for most of
# the flood, and the load's deadline bounds every request.
IDLE_TIMEOUT_S = 3600.0


async def _post(client: EngineClient, target: Target, result: RequestResult, prompt: str, *,
                stream: bool, on_body: Callable[[bytes], None]) -> Reply | None:  # fmt: skip
    """POST the request; a 200's body goes to ``on_body``. None (and ``result.error``) for
    another status."""
    body = orjson.dumps(target.body(prompt, result.max_tokens, stream=stream, heavy=result.heavy))
    reply = await client.post(target.url, body, idle_timeout_s=IDLE_TIMEOUT_S, on_body=on_body,
                              headers=target.headers(result.user))  # fmt: skip
    if reply.status == 200:
        return reply
    result.error = f"HTTP {reply.status}: {reply.body[:200].decode(errors='replace')}"
    return None


async def _whole(client: EngineClient, target: Target, result: RequestResult, prompt: str,
                 t0: float) -> None:  # fmt: skip
    content = bytearray()
    if await _post(client, target, result, prompt, stream=False, on_body=content.extend) is None:
        return
    try:
        usage = orjson.loads(content).get("usage") or {}
        tokens: int | None = int(usage["completion_tokens"])
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        tokens = None
    _done(result, tokens, t0)


async def _streamed(client: EngineClient, target: Target, result: RequestResult, prompt: str,
                    *, t0: float, bucket_s: float | None) -> None:  # fmt: skip
    # A light request's reads are kept (its inter-token latencies); the flood's would be
    # hundreds of thousands.
    tally = StreamTally(t0, bucket_s, reads=None if result.heavy else [])
    clock = time.perf_counter
    on_body = lambda data: tally.feed(data, clock())  # noqa: E731
    if await _post(client, target, result, prompt, stream=True, on_body=on_body) is None:
        return
    result.first_token_s, result.buckets = tally.first_token_s, tally.buckets
    result.reads = tally.reads or []
    if tally.first_token_s is not None:
        result.ttft_s = tally.first_token_s - result.arrival_s
    result.error = tally.tail_error() or (
        None if tally.first_token_s is not None else "the stream ended without content"
    )
    _done(result, tally.usage_tokens(), t0)


async def send(client: EngineClient, target: Target, result: RequestResult, prompt: str, *,
               stream: bool, t0: float, bucket_s: float | None = None) -> None:  # fmt: skip
    """Send one request now and fill ``result`` in; transport errors become its error."""
    result.arrival_s = time.perf_counter() - t0
    try:
        if stream:
            await _streamed(client, target, result, prompt, t0=t0, bucket_s=bucket_s)
        else:
            await _whole(client, target, result, prompt, t0)
    except HttpClientError as exc:
        result.error = f"{type(exc).__name__}: {exc}"


async def _at(client: EngineClient, target: Target, item: Planned, result: RequestResult,
              prompt: str, *, t0: float, bucket_s: float | None,
              window: asyncio.Semaphore | None) -> None:  # fmt: skip
    await asyncio.sleep(max(0.0, t0 + item.at_s - time.perf_counter()))
    # A heavy request in a window goes once one of the open ones has ended.
    gate = window if window is not None and item.heavy else contextlib.nullcontext()
    async with gate:
        await send(client, target, result, prompt, stream=item.stream, t0=t0, bucket_s=bucket_s)


async def run_load(
    target: Target,
    planned: Sequence[Planned],
    deadline_s: float,
    *,
    dead: Callable[[], str | None] = lambda: None,
    on_start: Callable[[float], None] = lambda _t0: None,
    bucket_s: float | None = None,
    heavy_window: int | None = None,
) -> LoadResult:
    """Send the plan once; requests still open at the deadline fail as "stopped".
    ``heavy_window``: at most this many heavy requests open at once (None: no bound).

    The light users' requests go from a process of their own (``_light_process``), as
    other clients than the flood's: this process reads every heavy stream, hundreds of
    thousands of events in a long flood, and a light user's first token waiting behind
    them on the same event loop would be the load client's wait, not fairq's."""
    rng = random.Random(0)
    prompts = [make_prompt(f"{p.user} {i}", p.prompt_tokens, rng) for i, p in enumerate(planned)]
    results = [RequestResult(p.user, p.heavy, p.at_s, p.max_tokens) for p in planned]
    light = [i for i, p in enumerate(planned) if not p.heavy]
    heavy = [i for i, p in enumerate(planned) if p.heavy]
    async with _light_process(bool(light)) as apart:
        t0 = time.perf_counter()
        on_start(t0)
        also = []
        if apart is not None:
            job = _LightJob(target, [planned[i] for i in light], [prompts[i] for i in light],
                            t0, deadline_s, bucket_s)  # fmt: skip
            also.append(asyncio.ensure_future(apart.run(job)))
        window = None if heavy_window is None else asyncio.Semaphore(heavy_window)
        ours = [(planned[i], results[i], prompts[i]) for i in heavy]
        stopped = await _send_all(target, ours, t0=t0, deadline_s=deadline_s, dead=dead,
                                  bucket_s=bucket_s, window=window, also=also)  # fmt: skip
    for task in also:  # the light users' results; cut, they fail as stopped below
        if task.done() and not task.cancelled():
            _take_light(task, light, results)
    _mark_stopped(results, stopped)
    ends = [r.end_s for r in results if r.end_s is not None]
    wall_s = max(ends, default=time.perf_counter() - t0)
    return LoadResult(results, wall_s, stopped, bucket_s)


def _take_light(
    task: asyncio.Future[list[RequestResult]], light: Sequence[int], results: list[RequestResult]
) -> None:
    """The light users' process returned their results, or failed: then each fails."""
    if (problem := task.exception()) is not None:
        for i in light:
            results[i].error = str(problem)
        return
    for i, result in zip(light, task.result(), strict=True):
        results[i] = result


def _mark_stopped(results: Sequence[RequestResult], stopped: str | None) -> None:
    """Requests still open when the load was stopped fail, saying why."""
    for result in results:
        if stopped is not None and result.end_s is None and result.error is None:
            result.error = f"stopped: {stopped}"


async def _send_all(
    target: Target,
    sends: Sequence[tuple[Planned, RequestResult, str]],
    *,
    t0: float,
    deadline_s: float,
    dead: Callable[[], str | None],
    bucket_s: float | None,
    window: asyncio.Semaphore | None,
    also: Sequence[asyncio.Future[Any]] = (),
) -> str | None:
    """Send each planned request at its time, filling its result in; wait for them and
    ``also`` until the deadline (why they were stopped, or None)."""
    async with EngineClient(CONNECT_TIMEOUT_S) as client:
        tasks: list[asyncio.Future[Any]] = [*also]
        for item, result, prompt in sends:
            send_it = _at(client, target, item, result, prompt, t0=t0, bucket_s=bucket_s,
                          window=window)  # fmt: skip
            tasks.append(asyncio.create_task(send_it))
        return await _wait_all(tasks, t0 + deadline_s, dead)


@dataclass(frozen=True)
class _LightJob:
    """The light users' part of a load, as their process gets it (JSON on its stdin)."""

    target: Target
    planned: list[Planned]
    prompts: list[str]
    t0: float  # the monotonic clock is the machine's: both processes time from it
    deadline_s: float
    bucket_s: float | None

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def of_json(cls, data: bytes) -> _LightJob:
        raw = orjson.loads(data)
        planned = [Planned(**p) for p in raw["planned"]]
        target = Target(**raw["target"])
        return cls(target, planned, raw["prompts"], raw["t0"], raw["deadline_s"], raw["bucket_s"])


class _LightProcess:
    """The light users' requests, sent from a process of their own (``python -m
    benchmarks.lib.load``): this one reads every heavy stream, and a light user's
    first token waiting behind them on the same event loop would be the load client's
    wait, not the stack's."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    async def run(self, job: _LightJob) -> list[RequestResult]:
        out, _ = await self._process.communicate(job.to_json())
        if self._process.returncode != 0:
            raise RuntimeError(f"the light users' process exited {self._process.returncode}")
        return [_result_of(r) for r in orjson.loads(out)]

    def stop(self) -> None:
        if self._process.returncode is None:
            self._process.kill()


@contextlib.asynccontextmanager
async def _light_process(wanted: bool) -> AsyncIterator[_LightProcess | None]:
    """The light users' process, started and ready (None when there are none); killed at
    the block's end if still running (the load was cut)."""
    if not wanted:
        yield None
        return
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.lib.load", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    light = _LightProcess(process)
    try:
        assert process.stdout is not None
        if await process.stdout.readline() != _READY:
            raise RuntimeError("the light users' process did not start")
        yield light
    finally:
        light.stop()
        await process.wait()


_READY = b"ready\n"


def _result_of(raw: dict[str, Any]) -> RequestResult:
    result = RequestResult(**raw)
    result.buckets = {int(k): v for k, v in raw["buckets"].items()}
    result.reads = [(float(at), int(n)) for at, n in raw["reads"]]
    return result


def _serve_light_job() -> None:
    """In the light users' process: say it is ready, take the job, send its requests at
    their times, write their results."""
    sys.stdout.buffer.write(_READY)
    sys.stdout.buffer.flush()
    job = _LightJob.of_json(sys.stdin.buffer.read())
    results = [RequestResult(p.user, p.heavy, p.at_s, p.max_tokens) for p in job.planned]
    sends = list(zip(job.planned, results, job.prompts, strict=True))
    sending = _send_all(job.target, sends, t0=job.t0, deadline_s=job.deadline_s,
                        dead=lambda: None, bucket_s=job.bucket_s, window=None)  # fmt: skip
    _mark_stopped(results, asyncio.run(sending))
    sys.stdout.buffer.write(orjson.dumps([dataclasses.asdict(r) for r in results],
                                         option=orjson.OPT_NON_STR_KEYS))  # fmt: skip


async def _wait_all(
    tasks: Sequence[asyncio.Future[Any]], deadline: float, dead: Callable[[], str | None]
) -> str | None:
    """Wait for every task until the deadline or a dead stack process; cancel the rest
    and say why they were stopped (None when all finished)."""
    pending: set[asyncio.Future[Any]] = set(tasks)
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


if __name__ == "__main__":
    _serve_light_job()
