"""The dispatcher in front of llama.cpp's ``llama-server --metrics``: the scraper reads the
server's page (``tests/fixtures/llamacpp-fb402660``, served by an HTTP server on
127.0.0.1) and admission acts on it as on vLLM's, although the page has no KV gauge and
no per-token histogram: room while its slots and queue allow, none once its queue is at
the target, none while the page fails."""

from __future__ import annotations

import time

from broker import ModelConfig, ModelSnapshot
from dispatcher.admission import ADMISSION, AdmissionConfig, Decision, Limit
from dispatcher.endpoints import SentLog, endpoint_states
from dispatcher.scraper import Scraper
from tests.dispatcher.test_scraper_idle import Engine, scraping_, serving
from tests.support.eventually import aeventually
from tests.support.paths import FIXTURES

PAGES = {
    name: (FIXTURES / "llamacpp-fb402660" / f"metrics_{name}.txt").read_bytes()
    for name in ("idle", "busy", "busy_later")
}
BANDS = ("interactive", "default", "batch")
SLOTS = 4  # the server's --parallel


def decide(scraper: Scraper, url: str, inflight: int, unstarted: int) -> Decision:
    """What the dispatcher decides for the interactive band with fairq's own ``inflight``
    jobs on the server, ``unstarted`` of them without a first token."""
    model = ModelConfig(name="m", engine="llamacpp", endpoints=(url,), batch_slots=SLOTS)
    snapshot = ModelSnapshot([], {url: inflight}, {url: unstarted})
    views = {url: scraper.view(url)}
    now = time.monotonic()
    [state] = endpoint_states([url], snapshot, views, SentLog(5.0), now=now, stale_s=2.0)
    return ADMISSION["metrics"].decide(state, "interactive", AdmissionConfig.of(model, BANDS))


async def test_the_dispatcher_admits_against_a_llamacpp_server() -> None:
    engine = Engine(PAGES["idle"])
    async with serving(engine) as url:
        scraper = Scraper([url], interval_s=0.05, unhealthy_after=2)
        async with scraping_(scraper):
            await aeventually(lambda: scraper.view(url).healthy, "a good scrape", 2.0)
            sample = scraper.view(url).sample
            assert sample is not None and sample.engine == "llamacpp"
            assert sample.kv_usage is None and sample.tpot_count == 0.0
            idle = decide(scraper, url, inflight=0, unstarted=0)
            assert (idle.room, idle.limit) == (3, Limit.QUEUE_TARGET)  # the band's target

            # 4 slots busy, 3 deferred: fairq's 7 jobs, 3 of them still without a token
            engine.page = PAGES["busy"]
            await aeventually(lambda: _waiting(scraper, url) == 3.0, "the busy page", 2.0)
            assert decide(scraper, url, inflight=7, unstarted=3).room == 0

            # Two busy scrapes, llama_decode() calls in between: its batch is its slots,
            # and the requests that ended give the time per token.
            engine.page = PAGES["busy_later"]
            await aeventually(lambda: _waiting(scraper, url) == 2.0, "the later page", 2.0)
            view = scraper.view(url)
            assert view.capacity.slots == SLOTS
            assert view.tpot_s is not None and abs(view.tpot_s - 28.16 / 512) < 1e-9

            # A page that fails (llama-server without --metrics answers 501): nothing.
            engine.failing = True
            await aeventually(lambda: not scraper.view(url).healthy, "unhealthy", 2.0)
            failing = decide(scraper, url, inflight=0, unstarted=0)
            assert (failing.room, failing.limit) == (0, Limit.UNHEALTHY)


def _waiting(scraper: Scraper, url: str) -> float | None:
    sample = scraper.view(url).sample
    return None if sample is None else sample.waiting
