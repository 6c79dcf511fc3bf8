"""The gateway's uvicorn server: ``GatewayServer`` drains the gateway before it stops.

``fairq.services.run_gateway`` runs it in the foreground. SIGINT and SIGTERM start a
graceful shutdown: answer the requests whose jobs are still queued with a retryable 503
(``Gateway.drain``), stop accepting, let the responses in flight finish for up to
``GRACEFUL_SHUTDOWN_S`` (then cancel them, which cancels the jobs of streams cut short),
close Redis, and return. uvicorn itself would re-raise the signal after shutting down;
``run`` returns normally instead, so the CLI entry point alone chooses the exit code.
"""

from __future__ import annotations

import socket

import uvicorn
from fastapi import FastAPI

from broker.process.uvicorn_server import QuietSignalServer, quiet_config
from broker.settings import Settings
from gateway.connections import guarded_protocol
from gateway.state import Gateway

GRACEFUL_SHUTDOWN_S = 10


def gateway_config(app: FastAPI, settings: Settings, host: str, port: int) -> uvicorn.Config:
    """uvicorn's settings for the gateway: fairq's shared ones, and the connection limits
    of ``settings.http`` (``gateway.connections``)."""
    limits = settings.http
    # uvicorn annotates timeout_keep_alive as int; it only hands it to loop.call_later.
    return quiet_config(
        app,
        host,
        port,
        GRACEFUL_SHUTDOWN_S,
        http=guarded_protocol(limits),
        timeout_keep_alive=limits.keep_alive_s,
    )


class GatewayServer(QuietSignalServer):
    """uvicorn's server, quiet when idle, that drains the gateway before it shuts down."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        gateway: Gateway | None = getattr(self._app.state, "gateway", None)
        if gateway is not None:
            await gateway.drain()
        await super().shutdown(sockets)
