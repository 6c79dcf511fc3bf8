"""Running the gateway under uvicorn in the foreground.

SIGINT and SIGTERM start a graceful shutdown: answer the requests whose jobs are
still queued with a retryable 503 (``Gateway.drain``), stop accepting, let the
responses in flight finish for up to ``GRACEFUL_SHUTDOWN_S`` (then cancel them,
which cancels the jobs of streams cut short), close Redis, and return. uvicorn
itself would re-raise the signal after shutting down; ``serve`` returns normally
instead, so the CLI entry point alone chooses the exit code.
"""

from __future__ import annotations

import socket

import uvicorn
from fastapi import FastAPI

from broker import heap
from broker.gateway.app import create_app
from broker.gateway.state import Gateway
from broker.serving import QuietSignalServer, quiet_config
from broker.settings import Settings

GRACEFUL_SHUTDOWN_S = 10


class _Server(QuietSignalServer):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        gateway: Gateway | None = getattr(self._app.state, "gateway", None)
        if gateway is not None:
            await gateway.drain()
        await super().shutdown(sockets)


def serve(settings: Settings, host: str, port: int) -> None:
    """Serve the gateway on ``host:port`` until SIGINT or SIGTERM (blocking)."""
    app = create_app(settings)
    heap.settle(settings)
    _Server(quiet_config(app, host, port, GRACEFUL_SHUTDOWN_S), app).run()
