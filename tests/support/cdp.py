"""A headless chromium driven over the Chrome DevTools protocol, for tests of web pages.

Starts Debian's ``chromium`` (no browser download: ``apt-get install chromium``) with a
fresh profile and no network features of its own, finds the page target over the
DevTools HTTP endpoint on loopback, and talks to it with ``websockets``. Only what
the tests need: navigate, evaluate JavaScript, take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from tests.support import local_http
from tests.support.eventually import eventually

_BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_START_S = 30.0
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1400,1000", "--remote-debugging-port=0",
    "--remote-debugging-address=127.0.0.1",
)  # fmt: skip


def find_browser() -> str | None:
    return next((path for name in _BROWSERS if (path := shutil.which(name))), None)


class Page:
    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        await self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:  # events arrive in between; only the reply to this call matters
            message = json.loads(await self._ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def evaluate(self, expression: str) -> Any:
        reply = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        reply = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(reply["data"]))


def _devtools_port(profile: Path, process: subprocess.Popen[bytes]) -> int:
    active = profile / "DevToolsActivePort"

    def written() -> str:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with {process.returncode}")
        return active.read_text().strip() if active.exists() else ""

    text = eventually(written, "chromium's DevTools port", _START_S, interval_s=0.05)
    return int(text.split()[0])


@contextlib.asynccontextmanager
async def browser_page(browser: str, url: str) -> AsyncIterator[Page]:
    """A page of a fresh headless chromium that has started loading ``url``."""
    # Chromium's helper processes may still write the profile as the main one exits: stop
    # the whole process group, and let a file written at the last moment not fail the test.
    with tempfile.TemporaryDirectory(
        prefix="fairq-chromium-", ignore_cleanup_errors=True
    ) as profile:
        process = subprocess.Popen(
            [browser, *FLAGS, f"--user-data-dir={profile}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            port = _devtools_port(Path(profile), process)
            targets = local_http.get(f"http://127.0.0.1:{port}/json/list", timeout=5.0).json()
            page = next(t for t in targets if t["type"] == "page")
            async with connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
                yield Page(ws)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
