"""The gateway's ``/dashboard`` in a real headless chromium, against the real local stack.

The page loads, asks ``/admin/status`` with the admin key from its URL fragment,
shows a card per demo model with its endpoint, bands (with the wait a job queued now
would be told) and newcomers' time to first token, and the quotas' use (a tenant's quota
here), and keeps updating (the poll counter
and the status time move on); a non-admin key gets the 403 shown.
``FAIRQ_UPDATE_SCREENSHOT=1`` also writes the screenshot to docs/dashboard.png, taken
``FAIRQ_SCREENSHOT_AFTER_S`` (2) seconds later, when the chart has more to show.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support.cdp import Page, browser_page, find_browser
from tests.support.eventually import aeventually
from tests.support.paths import REPO
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

BROWSER = find_browser()
_WAIT_S = 30.0
_DOCS = REPO / "docs" / "dashboard.png"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    if BROWSER is None:
        pytest.skip("no chromium: `apt-get install chromium` (make test does it as root)")
    backlog = {"demo-code": {"admission": "static", "inflight_cap": 1}}  # a visible backlog
    quotas = {"quotas": [{"tenant": "team-a", "tokens_per_day": 1_000_000_000}]}  # alice's
    with demo_stack(per_model=backlog, overrides=quotas) as running:
        yield running


class _Load:
    """Requests from two users to both models until stopped, so the page has data."""

    def __init__(self, stack: Stack) -> None:
        self._url = f"{stack.gateway_url}/v1/chat/completions"
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(key, model, concurrent))
            for key, model, concurrent in (
                ("fq-demo-alice", "demo-code", 6), ("fq-demo-bob", "demo-code", 2),
                ("fq-demo-alice", "demo-chat", 3),
            )
        ]  # fmt: skip

    def _run(self, key: str, model: str, concurrent: int) -> None:
        body = {"model": model, "max_tokens": 40, "stream": True,
                "messages": [{"role": "user", "content": "Hello"}]}  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(timeout=_WAIT_S) as client:
            while not self._stop.is_set():
                # A few at once: the static cap of demo-code queues the rest.
                pending = [
                    threading.Thread(target=client.post, args=(self._url,),
                                     kwargs={"headers": headers, "json": body})
                    for _ in range(concurrent)
                ]  # fmt: skip
                for t in pending:
                    t.start()
                for t in pending:
                    t.join(_WAIT_S)

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(_WAIT_S)


async def _until(page: Page, expression: str, what: str) -> None:
    """Until ``expression`` holds on the page; each value seen comes with what the page says.
    A RuntimeError is a navigation that replaced the document meanwhile: not yet."""
    with_state = f"[{expression}, document.getElementById('state')?.textContent]"
    await aeventually(
        lambda: page.evaluate(with_state),
        what,
        _WAIT_S,
        until=lambda seen: seen[0],
        interval_s=0.2,
        ignoring=(RuntimeError,),
    )


_CARDS = "[...document.querySelectorAll('section.model')].map(s => s.dataset.model)"
_POLLS = "Number(document.body.dataset.polls || 0)"


async def test_the_dashboard_loads_shows_both_models_and_updates(
    stack: Stack, tmp_path: Path
) -> None:
    assert BROWSER is not None
    url = f"{stack.gateway_url}/dashboard#key=fq-demo-admin"
    with _Load(stack):
        async with browser_page(BROWSER, url) as page:
            await _until(page, f"{_CARDS}.length === 2", "a card per model")
            assert sorted(await page.evaluate(_CARDS)) == sorted(DEMO_MODELS)
            first = await page.evaluate(_POLLS)
            first_at = await page.evaluate("document.body.dataset.updatedMs")
            await _until(page, f"{_POLLS} >= {first + 3}", "three more polls")
            assert await page.evaluate("document.body.dataset.updatedMs") != first_at
            # the key left the address bar once read
            assert "key=" not in await page.evaluate("location.href")
            for model in DEMO_MODELS:
                card = f"document.querySelector('section[data-model=\"{model}\"]')"
                assert await page.evaluate(f"{card}.querySelectorAll('tr[data-endpoint]').length")
                bands = await page.evaluate(
                    f"[...{card}.querySelectorAll('tr[data-band]')].map(r => r.dataset.band)"
                )
                assert bands == ["interactive", "default", "batch"]
                assert await page.evaluate(f"{card}.querySelector('canvas') !== null")
            await _until(
                page,
                "[...document.querySelectorAll('section.model')]"
                ".some(s => Number(s.dataset.queued) > 0)",
                "a backlog on the page",
            )
            await _until(page, "document.body.innerText.includes('alice')", "a top user")
            # the wait a job queued now would be told, at the back of demo-code's backlog
            await _until(
                page,
                'document.querySelector(\'section[data-model="demo-code"] '
                'tr[data-band="default"] td.wait[data-who="back"]\')?.dataset.waitS',
                "a wait estimate at the back of a band",
            )
            # demo-code's cap of 1 sends every job while its user has nothing in the engine
            await _until(
                page,
                "document.querySelector('section[data-model=\"demo-code\"] .newcomers')"
                "?.dataset.p50",
                "a newcomer's time to first token",
            )
            # alice's tenant's quota, charged as her jobs are queued
            await _until(
                page,
                'Number(document.querySelector(\'#quotas tr[data-scope="tenant"]'
                '[data-name="team-a"][data-limit="tokens_per_day"]\')?.dataset.used) > 0',
                "a quota's use",
            )
            keep = os.environ.get("FAIRQ_UPDATE_SCREENSHOT") == "1"
            if keep:  # the docs' picture: a few more seconds of the chart
                await asyncio.sleep(float(os.environ.get("FAIRQ_SCREENSHOT_AFTER_S", "2")))
            shot = tmp_path / "dashboard.png"
            await page.screenshot(shot)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            if keep:
                _DOCS.write_bytes(shot.read_bytes())

            # The data endpoint answers admin keys only (anyone else: 404, as if it did not
            # exist); the page says so.
            await page.evaluate("sessionStorage.clear()")
            await page.goto(f"{stack.gateway_url}/dashboard?as=alice#key=fq-demo-alice")
            await _until(
                page,
                "(document.getElementById('state')?.textContent || '')"
                ".startsWith('404: not an admin API key')",
                "the 404 of a non-admin key",
            )
            assert await page.evaluate(f"{_CARDS}.length") == 0
