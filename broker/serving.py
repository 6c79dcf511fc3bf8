"""A uvicorn server whose SIGINT/SIGTERM end the process normally, for fairq's HTTP processes.

uvicorn re-raises a captured signal after its graceful shutdown, so Ctrl-C ends
in KeyboardInterrupt and SIGTERM in status 143. Our entry points choose their
own exit codes, so this server only turns the signal into a graceful shutdown.
Subclasses add what their shutdown must do first (``shutdown``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn


def quiet_config(app: Any, host: str, port: int, graceful_s: float) -> uvicorn.Config:
    """The uvicorn settings fairq's HTTP processes share: no access log, no banner."""
    return uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
        timeout_graceful_shutdown=graceful_s, server_header=False,
    )  # fmt: skip


class QuietSignalServer(uvicorn.Server):
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
