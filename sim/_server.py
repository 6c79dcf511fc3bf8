"""Run one simulated engine pod: uvicorn in the foreground until SIGINT or SIGTERM."""

from __future__ import annotations

import socket

import uvicorn

from broker import QuietSignalServer, quiet_config
from sim._app import create_app
from sim._engine import Engine
from sim._profile import SimProfile

# A backstop: open requests are aborted as soon as a signal arrives, so their
# connections close at once; this only bounds a connection that still hangs.
GRACEFUL_SHUTDOWN_S = 3


class _Server(QuietSignalServer):
    """uvicorn.Server that stops like a pod told to stop: abort, close, exit 0.

    uvicorn would wait for open streams to finish, then re-raise the captured
    signal, so Ctrl+C ends in KeyboardInterrupt and SIGTERM in status 143.
    """

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self._engine = engine

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Streams end without [DONE], as from a real engine that is shutting down.
        self._engine.abort_all()
        await super().shutdown(sockets)


def serve(
    host: str, port: int, models: list[str], profile: SimProfile, *, startup_s: float = 0.0
) -> None:
    """Serve `models` on host:port from one simulated engine; blocks until a signal.
    ``startup_s``: every route answers 503 for that long first (``create_app``)."""
    app = create_app(models, profile, startup_s=startup_s)
    _Server(quiet_config(app, host, port, GRACEFUL_SHUTDOWN_S), app.state.sim_engine).run()
