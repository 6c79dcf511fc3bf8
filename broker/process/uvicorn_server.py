"""A uvicorn server for fairq's HTTP processes: quiet when idle, ended normally by a signal.

uvicorn re-raises a captured signal after its graceful shutdown, so Ctrl-C ends
in KeyboardInterrupt and SIGTERM in status 143. Our entry points choose their
own exit codes, so this server only turns the signal into a graceful shutdown.
Subclasses add what their shutdown must do first (``shutdown``).

uvicorn's main loop also wakes ten times a second to see whether it should stop,
and each wake-up of an idle process costs CPU that a lightly loaded gateway would
otherwise spend on tokens (``docs/performance.md``). This server's loop wakes once
a second (to refresh the ``Date`` header, as uvicorn does every tenth tick) and at
once when a signal asks it to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

TICK_S = 1.0


def quiet_config(
    app: Any, host: str, port: int, graceful_s: float, **options: Any
) -> uvicorn.Config:
    """The uvicorn settings fairq's HTTP processes share: no access log, no banner;
    ``options`` are a process's own (the gateway's connection limits)."""
    # uvicorn annotates timeout_graceful_shutdown as int but only hands it to
    # asyncio.wait_for, which takes float seconds.
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=graceful_s,  # type: ignore[arg-type]
        server_header=False,
        **options,
    )


class QuietSignalServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only (tests run servers in threads)
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:  # wake the main loop now rather than at its next tick
            self._loop.call_soon_threadsafe(self._stopping.set)

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000  # every tick counts as a tenth: Date header
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._stopping.wait()
            self._stopping.clear()
