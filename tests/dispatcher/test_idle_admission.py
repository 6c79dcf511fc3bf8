"""The first job after idle, with a real Redis, the dispatcher and a worker in this event
loop and the engine simulator: the idle engine is read seldom, yet the job is admitted at
once (no scrape awaited), and sending it brings the engine's scrapes back to every tick."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from broker import AsyncClient
from sim import create_app as create_sim
from tests.support.eventually import aeventually
from tests.support.servers import uvicorn_thread
from tests.support.settings import ALICE_KEY, MODEL, make_settings
from tests.support.stack import FAST, components

pytestmark = pytest.mark.integration

STALE_S = 8.0  # metrics_stale_s: an idle engine is read every half of it, 4 s
ASGI = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class CountingScrapes:
    """The simulator, with the arrival time of every ``/metrics`` request kept."""

    def __init__(self, app: ASGI) -> None:
        self.app = app
        self.scrapes: list[float] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/metrics":
            self.scrapes.append(time.monotonic())
        await self.app(scope, receive, send)

    def since(self, moment: float) -> list[float]:
        return [t for t in self.scrapes if t >= moment]


async def first_output_s(client: AsyncClient) -> float:
    started = time.monotonic()
    job_id = await client.submit(
        MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    async for chunk in client.stream(job_id):
        if chunk.get("choices"):
            return time.monotonic() - started
    raise AssertionError("the job streamed nothing")


async def test_the_first_job_after_idle_waits_for_no_scrape_and_wakes_the_scraping(
    redis_url: str,
) -> None:
    engine = CountingScrapes(create_sim([MODEL], FAST))
    with uvicorn_thread(engine) as url:
        settings = make_settings(
            redis_url,
            [url],
            quick=True,  # its fast scrapes (every 0.05 s), with admission by metrics:
            model_fields={"admission": "metrics"},
            metrics_stale_s=STALE_S,
        )
        async with components(settings), AsyncClient(settings, api_key=ALICE_KEY) as client:
            await aeventually(lambda: engine.scrapes, "the first scrape", 10.0)
            await aeventually(
                lambda: time.monotonic() - engine.scrapes[-1] > 1.0, "a quiet engine", 10.0
            )
            idle_since = time.monotonic()
            assert len(engine.since(idle_since - 1.0)) == 0  # read seldom while idle

            took_s = await first_output_s(client)
            assert took_s < 1.0  # far less than the 4 s between the idle engine's scrapes
            # The job sent woke the scraping: a scrape at the next tick, not 4 s on.
            woken = await aeventually(
                lambda: engine.since(idle_since), "a scrape after the job was sent", 1.5
            )
            assert woken[0] - idle_since < 1.0 + took_s
