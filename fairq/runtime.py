"""Running one long-lived asyncio service under signals.

SIGINT and SIGTERM set a stop event (the service drains and returns); a second
signal exits at once. Only the CLI decides exit codes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable


def setup_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("FAIRQ_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # httpx logs every engine request at INFO: too much for a worker's default level.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                os._exit(130)  # second signal: the operator insists
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        await main(stop)

    with asyncio.Runner(loop_factory=_loop_factory()) as loop_runner:
        loop_runner.run(runner())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed: less CPU per event on the streaming hot path."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
