"""One process that serves many simulated engine replicas (``python -m
benchmarks.fleet.host``), each on a loopback address of its own, started and stopped
on request over a small HTTP control API on 127.0.0.1.

Why not one ``fairq sim`` process per replica: each costs about 0.4 s of CPU to import
and 70 MB of memory, so the fleet benchmark's first wave (tens of models woken at once on
a 2-core box) would stretch every replica's start by seconds of import time that a real
pod spends elsewhere. Here a replica is ``sim.create_app`` (the same app ``fairq
sim`` serves, with its ``startup_s``: 503 on every route until the weights are "loaded")
under a uvicorn server of its own in this process's event loop: a start costs
milliseconds, and an idle replica costs nothing but its server's tick.

Control API (JSON): ``POST /replicas`` ``{"host", "port", "model", "startup_s"}``
answers once the replica listens (it then answers 503 until ``startup_s`` passed);
``DELETE /replicas/{host}`` stops it (open streams are aborted, as a stopped pod's:
the benchmark drains a replica before it stops it); ``GET /replicas`` lists them.
SIGTERM or SIGINT stops every replica, then the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import click
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker import QuietSignalServer, quiet_config
from sim import SimProfile, create_app, load_profile

_STOP_GRACE_S = 3  # a replica's open connections after its engine aborted what it ran


class _Engine(Protocol):
    def abort_all(self) -> None:
        """End every request it holds (a stopped pod's streams end without [DONE])."""


class _ReplicaServer(uvicorn.Server):
    """A replica's server: the process's signals belong to the control server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class _Replica:
    server: _ReplicaServer
    task: asyncio.Task[None]
    model: str
    engine: _Engine


class Host:
    """The replicas this process serves, by address."""

    def __init__(self, profile: SimProfile) -> None:
        self._profile = profile
        self.replicas: dict[str, _Replica] = {}

    async def start(self, host: str, port: int, model: str, startup_s: float) -> None:
        if host in self.replicas:
            raise ValueError(f"a replica already listens on {host}")
        # Bound here, not by uvicorn: it would exit the process on an address in use.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        app = create_app([model], self._profile, startup_s=startup_s)
        server = _ReplicaServer(quiet_config(app, host, port, _STOP_GRACE_S))
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"replica {host}")
        while not server.started:  # bound and its lifespan (the engine loop) started
            if task.done():
                task.result()  # raises what stopped it (the address was taken, ...)
                raise RuntimeError(f"the replica on {host}:{port} stopped while starting")
            await asyncio.sleep(0.005)
        self.replicas[host] = _Replica(server, task, model, app.state.sim_engine)

    async def stop(self, host: str) -> bool:
        replica = self.replicas.pop(host, None)
        if replica is None:
            return False
        replica.engine.abort_all()
        replica.server.should_exit = True
        await replica.task
        return True

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(h) for h in list(self.replicas)))


def control_app(host: Host) -> Starlette:
    async def start(request: Request) -> Response:
        body = orjson.loads(await request.body())
        try:
            await host.start(body["host"], int(body["port"]), body["model"],
                             float(body["startup_s"]))  # fmt: skip
        except (OSError, ValueError, RuntimeError) as exc:
            return Response(orjson.dumps({"error": str(exc)}), status_code=409)
        return Response(orjson.dumps({"ok": True}))

    async def stop(request: Request) -> Response:
        found = await host.stop(request.path_params["host"])
        return Response(orjson.dumps({"ok": found}), status_code=200 if found else 404)

    async def listing(_: Request) -> Response:
        rows = {address: r.model for address, r in host.replicas.items()}
        return Response(orjson.dumps(rows))

    return Starlette(routes=[
        Route("/replicas", start, methods=["POST"]),
        Route("/replicas", listing, methods=["GET"]),
        Route("/replicas/{host}", stop, methods=["DELETE"]),
    ])  # fmt: skip


async def serve(port: int, profile: SimProfile) -> None:
    host = Host(profile)
    control = QuietSignalServer(quiet_config(control_app(host), "127.0.0.1", port, 1))
    try:
        await control.serve()
    finally:
        await host.stop_all()


@click.command()
@click.option("--port", type=int, required=True, help="the control API's port on 127.0.0.1")
@click.option("--profile", default="default", help="the replicas' sim profile (name or path)")
def main(port: int, profile: str) -> None:
    """Serve simulated engine replicas on request (the fleet benchmark's pods)."""
    asyncio.run(serve(port, load_profile(profile)))
    sys.exit(0)


if __name__ == "__main__":
    main()
