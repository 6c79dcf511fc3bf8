"""Adaptive scraping (``dispatcher.scraper``): a quiet engine is read at the idle interval,
a wake or a busy engine brings it back to every tick, and a page whose wanted lines did
not change is not parsed again. Engines are lean TCP servers on 127.0.0.1 in the test's
own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker import Unseen
from dispatcher import scraper as scraping
from dispatcher.engine_metrics import EngineSample
from dispatcher.scraper import Scraper
from tests.support.eventually import aeventually
from tests.support.paths import FIXTURES
from tests.support.servers import stop

IDLE = (FIXTURES / "vllm-0.32-cpu" / "metrics_idle.txt").read_bytes()
LOAD = (FIXTURES / "vllm-0.32-cpu" / "metrics_load.txt").read_bytes()
TICK_S = 0.05
QUIET_S = 0.5  # ten ticks


class Engine:
    """``/metrics`` answering ``page`` (500 while ``failing``); every request's arrival kept.
    Each answer's first line differs, as an engine's process metrics do between scrapes."""

    def __init__(self, page: bytes) -> None:
        self.page = page
        self.failing = False
        self.arrivals: list[float] = []
        self.handlers: list[asyncio.Task[Any]] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        self.handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    self.arrivals.append(time.monotonic())
                    body = b"process_cpu_seconds_total %d\n" % len(self.arrivals) + self.page
                    status = b"500 Internal Server Error" if self.failing else b"200 OK"
                    writer.write(
                        b"HTTP/1.1 %s\r\ncontent-type: text/plain; version=0.0.4\r\n"
                        b"content-length: %d\r\n\r\n%s" % (status, len(body), body)
                    )
        finally:
            writer.close()

    def since(self, moment: float) -> list[float]:
        return [t for t in self.arrivals if t >= moment]


@contextlib.asynccontextmanager
async def serving(engine: Engine) -> AsyncIterator[str]:
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await stop(engine.writers, engine.handlers)


@contextlib.asynccontextmanager
async def scraping_(scraper: Scraper) -> AsyncIterator[None]:
    task = asyncio.create_task(scraper.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make(url: str, **fields: Any) -> Scraper:
    return Scraper([url], interval_s=TICK_S, idle_interval_s=QUIET_S, **fields)


async def scrapes_in(engine: Engine, url: str, seconds: float, **fields: Any) -> int:
    scraper = make(url, **fields)
    started = time.monotonic()
    async with scraping_(scraper):
        await asyncio.sleep(seconds)
    return len(engine.since(started))


async def test_a_quiet_engine_is_read_at_the_idle_interval() -> None:
    engine = Engine(IDLE)
    async with serving(engine) as url:
        count = await scrapes_in(engine, url, 1.3)
    # at 0 (found quiet), then every ten ticks
    assert 2 <= count <= 4, engine.arrivals


@pytest.mark.parametrize("why", ["busy", "jobs-unseen", "failing"])
async def test_an_engine_not_known_quiet_is_read_at_every_tick(why: str) -> None:
    engine = Engine(LOAD if why == "busy" else IDLE)
    engine.failing = why == "failing"

    async def unseen(endpoint: str, start_s: float) -> Unseen:
        return Unseen(1, 0)  # a job on its way: the sample cannot show it yet

    fields = {"unseen": unseen} if why == "jobs-unseen" else {}
    async with serving(engine) as url:
        count = await scrapes_in(engine, url, 1.3, **fields)
    assert count >= 18, engine.arrivals


async def test_a_wake_reads_a_quiet_engine_at_the_next_tick() -> None:
    engine = Engine(IDLE)
    async with serving(engine) as url:
        scraper = Scraper([url], interval_s=TICK_S, idle_interval_s=30.0)
        async with scraping_(scraper):
            await aeventually(lambda: scraper.quiet(url), "the engine quiet", 2.0)
            await asyncio.sleep(0.2)
            assert len(engine.arrivals) == 1  # nothing more in the idle interval
            woken = time.monotonic()
            engine.page = LOAD  # the job fairq sent is in the engine now
            scraper.wake(url)
            await aeventually(lambda: len(engine.since(woken)) >= 4, "scrapes again", 2.0)
            assert engine.since(woken)[0] - woken < TICK_S + 0.05  # the next tick
            assert not scraper.quiet(url)


async def test_a_wake_read_quiet_again_goes_back_to_the_idle_interval() -> None:
    engine = Engine(IDLE)
    async with serving(engine) as url:
        scraper = Scraper([url], interval_s=TICK_S, idle_interval_s=30.0)
        async with scraping_(scraper):
            await aeventually(lambda: scraper.quiet(url), "the engine quiet", 2.0)
            woken = time.monotonic()
            scraper.wake(url)  # a job that ended before the next scrape
            await aeventually(lambda: engine.since(woken), "the woken scrape", 2.0)
            await aeventually(lambda: scraper.quiet(url), "quiet again", 2.0)
            await asyncio.sleep(0.3)
            assert len(engine.since(woken)) == 1


async def test_a_wake_on_a_busy_endpoint_adds_no_scrape() -> None:
    engine = Engine(LOAD)
    async with serving(engine) as url:
        scraper = make(url)
        async with scraping_(scraper):
            await aeventually(lambda: len(engine.arrivals) >= 3, "three scrapes", 2.0)
            before = len(engine.arrivals)
            for _ in range(100):
                scraper.wake(url)
            await asyncio.sleep(TICK_S * 2.5)
            assert len(engine.arrivals) - before <= 3


async def test_unchanged_wanted_lines_keep_their_sample_without_a_parse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[bytes] = []
    parse = scraping.parse_wanted

    def counting(lines: bytes, model_name: str | None = None) -> EngineSample:
        parsed.append(lines)
        return parse(lines, model_name)

    monkeypatch.setattr(scraping, "parse_wanted", counting)
    engine = Engine(IDLE)
    async with serving(engine) as url:
        scraper = make(url)
        try:
            for _ in range(3):  # each page differs, but not in a line admission reads
                await scraper.scrape_once()
            first = scraper.view(url).sample
            assert len(parsed) == 1 and first is not None and first.waiting == 0
            engine.page = LOAD
            await scraper.scrape_once()
            view = scraper.view(url)
            assert len(parsed) == 2 and view.sample is not None and view.sample.waiting == 8
            assert len(engine.arrivals) == 4 and view.healthy
        finally:
            scraper.close()


async def test_while_every_engine_is_quiet_the_scraper_sleeps_between_their_scrapes() -> None:
    looks: list[float] = []

    class Counted(Scraper):
        def _start_due(self, now: float) -> float:
            looks.append(now)
            return super()._start_due(now)

    engine = Engine(IDLE)
    async with serving(engine) as url:
        scraper = Counted([url], interval_s=0.02, idle_interval_s=0.6)
        async with scraping_(scraper):
            await aeventually(lambda: scraper.quiet(url), "the engine quiet", 2.0)
            looks.clear()
            await asyncio.sleep(1.0)
    assert 1 <= len(looks) <= 4, looks  # its scrapes, not 50 ticks
