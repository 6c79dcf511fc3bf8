"""Load for the latency-under-load benchmark: the engine's capacity, and a steady background.

``capacity`` saturates the engine directly (closed loop: more streams in flight than the
engine runs at once, each sent again as soon as it ended) and counts the requests that
ended per second: the most the engine completes of that request shape.

The background is an open loop (Poisson arrivals at a fixed rate, as independent users
make) of streamed chat completions, run in a process of its own (``python -m
benchmarks.streaming.latency_load``) so that its event loop does not delay the probes'
timing. It prints one JSON line when it stops (SIGTERM): requests sent, ended, failed, and
its span.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from dataclasses import dataclass

import click
import httpx
import orjson


@dataclass(frozen=True)
class Target:
    url: str  # the chat completions URL
    model: str
    tokens: int  # max_tokens of each request
    key: str | None = None  # bearer key (fairq's gateway); None calls the engine itself

    def body(self) -> dict[str, object]:
        return {"model": self.model, "stream": True, "max_tokens": self.tokens,
                "messages": [{"role": "user", "content": "Tell me a story."}]}  # fmt: skip

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


async def one(client: httpx.AsyncClient, target: Target) -> bool:
    """Send one streamed request and read it to its end; True when it ended well."""
    try:
        async with client.stream(
            "POST", target.url, json=target.body(), headers=target.headers()
        ) as response:
            async for _ in response.aiter_raw():
                pass
            return response.status_code == 200
    except httpx.HTTPError:
        return False


def _client(connections: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(timeout=60, limits=limits)


async def capacity(target: Target, streams: int, seconds: float) -> float:
    """Requests per second the engine completes when ``streams`` are always in flight."""
    ended = 0
    stop_at = time.monotonic() + seconds

    async def loop(client: httpx.AsyncClient) -> None:
        nonlocal ended
        while time.monotonic() < stop_at:
            ok = await one(client, target)  # not `ended += await ...`: that reads first
            ended += ok

    async with _client(streams) as client:
        await asyncio.gather(*(one(client, target) for _ in range(streams)))  # warm-up
        start = time.monotonic()
        stop_at = start + seconds
        await asyncio.gather(*(loop(client) for _ in range(streams)))
        return ended / (time.monotonic() - start)


async def background(target: Target, rate: float, stop: asyncio.Event) -> dict[str, object]:
    """Poisson arrivals at ``rate`` per second until ``stop``; counts of what happened."""
    rng = random.Random(11)
    results: list[bool] = []
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()

    async def send(client: httpx.AsyncClient) -> None:
        results.append(await one(client, target))

    async with _client(1000) as client:
        while not stop.is_set():
            task = asyncio.create_task(send(client))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), rng.expovariate(rate))
        span = time.monotonic() - start
        sent = len(tasks) + len(results)
        if tasks:
            await asyncio.wait(tasks, timeout=30)
    return {"sent": sent, "ended_ok": sum(results), "failed": len(results) - sum(results),
            "span_s": span, "rate_per_s": sent / span}  # fmt: skip


@click.command()
@click.option("--url", required=True)
@click.option("--model", required=True)
@click.option("--tokens", type=int, required=True)
@click.option("--rate", type=float, required=True, help="requests per second")
@click.option("--key", default=None)
def main(url: str, model: str, tokens: int, rate: float, key: str | None) -> None:
    """Send the background load until SIGTERM, then print its counts as one JSON line."""

    async def run() -> dict[str, object]:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        return await background(Target(url, model, tokens, key), rate, stop)

    click.echo(orjson.dumps(asyncio.run(run())).decode())


if __name__ == "__main__":
    main()
