"""The fleet benchmark's replicas as Kubernetes handles pods behind a headless Service.

``Fleet.start`` is a pod created: a replica starts on a loopback address of its own (in a
replica host: ``benchmarks.fleet.host``) and answers 503 while it "loads its weights";
a readiness probe reads its ``/health`` every ``probe_s``, and only once it answers 200
does the model's DNS name get the replica's record (a headless Service publishes ready
pods only). ``Fleet.stop`` is a pod stopped: its record goes first, then the preStop hook
(``fairq.k8s.drain.drain``: wait for dispatchers to stop sending, then for the engine
to hold no request), then the replica stops. Every step's time is kept on the
``Replica`` (``time.monotonic()`` seconds, the load's clock too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from benchmarks.fleet.dns import Zone
from fairq.k8s.drain import drain
from fairq.stack.answering import wait_answering
from fairq.stack.children import start_child
from fairq.stack.localredis import free_port

State = Literal["starting", "ready", "stopping", "stopped"]
HOST_START_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 60.0


def dns_name(model: str) -> str:
    """The model's headless Service name."""
    return f"engine-{model}.fleet.svc.cluster.local"


@dataclass
class Replica:
    model: str
    address: str
    host: int  # which replica host serves it
    requested_s: float  # the autoscaler asked for it
    cause: str = "poll"  # what decided the start: "poll" (a metric read) or "push"
    state: State = "starting"
    listening_s: float | None = None
    ready_s: float | None = None  # its readiness probe passed
    published_s: float | None = None  # its record is in DNS
    found_s: float | None = None  # the first DNS answer that carried its record
    retired_s: float | None = None  # the autoscaler asked it to go (its record went)
    dropped_s: float | None = None  # the first DNS answer after its record went
    drained_s: float | None = None
    stopped_s: float | None = None
    drain_status: int | None = None  # the drain's exit status (0: idle)
    served: int | None = None  # requests it completed (vllm:request_success_total)
    error: str | None = None


class ReplicaError(Exception):
    """A replica host failed to start or stop a replica."""


def _addresses() -> Iterator[str]:
    """Loopback addresses never used twice in a run (as pod IPs seldom are at once)."""
    for a, b in itertools.product(range(1, 255), range(1, 255)):
        yield f"127.1.{a}.{b}"


@contextlib.contextmanager
def replica_hosts(count: int, profile: str) -> Iterator[dict[str, int]]:
    """``count`` replica host processes; yields their control URLs and process ids; all
    stopped after."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for _ in range(count):
            port = free_port()
            args = [sys.executable, "-m", "benchmarks.fleet.host", "--port", str(port),
                    "--profile", profile]  # fmt: skip
            procs.append(subprocess.Popen(args, preexec_fn=start_child))  # noqa: PLW1509
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            _wait_control(url, proc)
        yield {url: proc.pid for url, proc in zip(urls, procs, strict=True)}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_control(url: str, proc: subprocess.Popen[bytes]) -> None:
    if wait_answering(f"{url}/replicas", HOST_START_TIMEOUT_S, alive=lambda: proc.poll() is None):
        return
    if proc.poll() is not None:
        raise ReplicaError(f"the replica host for {url} exited with {proc.returncode}")
    raise ReplicaError(f"the replica host at {url} did not answer in {HOST_START_TIMEOUT_S} s")


class Fleet:
    """Every replica of the run, by model; starts and stops them (module docstring)."""

    def __init__(  # noqa: PLR0917 (the pods' whole context)
        self,
        hosts: list[str],
        zone: Zone,
        port: int,
        startup_s: float,
        probe_s: float,
        settle_s: float,
    ) -> None:
        self._hosts, self._zone, self.port = hosts, zone, port
        self._startup_s, self._probe_s, self._settle_s = startup_s, probe_s, settle_s
        self._addresses = _addresses()
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        # The drains wait in threads (the hook is blocking, standard library code); a
        # fleet going to zero drains tens at once, more than asyncio's default pool.
        self._drains = ThreadPoolExecutor(max_workers=64, thread_name_prefix="fleet-drain")
        self._tasks: set[asyncio.Task[None]] = set()
        self.replicas: list[Replica] = []

    def live(self, model: str) -> list[Replica]:
        """The model's replicas that count for its scale: starting or ready."""
        return [r for r in self.replicas if r.model == model and r.state in ("starting", "ready")]

    def url(self, replica: Replica) -> str:
        return f"http://{replica.address}:{self.port}"

    def start(self, model: str, cause: str = "poll") -> Replica:
        counts = [sum(1 for r in self.replicas if r.host == i and r.state != "stopped")
                  for i in range(len(self._hosts))]  # fmt: skip
        host = counts.index(min(counts))
        replica = Replica(model, next(self._addresses), host, time.monotonic(), cause)
        self.replicas.append(replica)
        self._spawn(self._start(replica))
        return replica

    def stop(self, replica: Replica) -> None:
        if replica.state in ("stopping", "stopped"):
            return
        was_published = replica.published_s is not None
        replica.state = "stopping"
        replica.retired_s = time.monotonic()
        self._zone.discard(dns_name(replica.model), replica.address)
        self._spawn(self._stop(replica, drain_first=was_published))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _start(self, replica: Replica) -> None:
        body = {"host": replica.address, "port": self.port, "model": replica.model,
                "startup_s": self._startup_s}  # fmt: skip
        try:
            answer = await self._http.post(f"{self._hosts[replica.host]}/replicas", json=body)
            if answer.status_code != 200:
                raise ReplicaError(f"starting {replica.address}: {answer.text[:200]}")
            replica.listening_s = time.monotonic()
            while replica.state == "starting":  # the readiness probe
                with contextlib.suppress(httpx.HTTPError):
                    health = await self._http.get(f"{self.url(replica)}/health", timeout=1.0)
                    if health.status_code == 200:
                        break
                await asyncio.sleep(self._probe_s)
            if replica.state != "starting":
                return  # removed while it started: never published
            replica.ready_s = time.monotonic()
            replica.state = "ready"
            # Noted first: the DNS thread may answer with the record before this line ends.
            replica.published_s = time.monotonic()
            self._zone.add(dns_name(replica.model), replica.address)
        except (httpx.HTTPError, ReplicaError) as exc:
            replica.error = f"start: {exc}"
            replica.state = "stopped"

    async def _stop(self, replica: Replica, *, drain_first: bool) -> None:
        url = self.url(replica)
        try:
            if drain_first:
                # The dispatchers read DNS every discovery interval: until then they may
                # still send to the replica (the hook's settle time).
                await asyncio.sleep(self._settle_s)
                loop = asyncio.get_running_loop()
                hook = functools.partial(
                    drain, url, timeout_s=DRAIN_TIMEOUT_S, interval_s=0.1, say=_quiet
                )
                replica.drain_status = await loop.run_in_executor(self._drains, hook)
                replica.drained_s = time.monotonic()
                replica.served = await self._served(url)
            elif replica.listening_s is None and replica.error is None:
                while replica.listening_s is None and replica.error is None:
                    await asyncio.sleep(0.01)  # its start request is still on its way
            control = self._hosts[replica.host]
            answer = await self._http.delete(f"{control}/replicas/{replica.address}")
            if answer.status_code not in (200, 404):
                raise ReplicaError(f"stopping {replica.address}: {answer.text[:200]}")
        except (httpx.HTTPError, ReplicaError) as exc:
            replica.error = f"stop: {exc}"
        replica.stopped_s = time.monotonic()
        replica.state = "stopped"

    async def _served(self, url: str) -> int:
        """Requests the replica completed, from its vLLM counter."""
        text = (await self._http.get(f"{url}/metrics")).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:request_success_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def dns_questions(self) -> int:
        """Questions the DNS server answered so far (the dispatcher's reads)."""
        return self._zone.questions

    def note_reads(self) -> None:
        """Copy onto each replica when the DNS answers first carried its record and first
        left it out (the dispatchers' reads: ``Zone.found_s`` and ``Zone.dropped_s``)."""
        for replica in self.replicas:
            replica.found_s = self._zone.found_s.get(replica.address)
            replica.dropped_s = self._zone.dropped_s.get(replica.address)

    async def stop_all(self, timeout_s: float) -> None:
        """Stop every replica (drained), and wait for every start and stop under way."""
        for replica in list(self.replicas):
            self.stop(replica)
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline:
            await asyncio.wait(set(self._tasks), timeout=max(0.1, deadline - time.monotonic()))

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._http.aclose()
        self._drains.shutdown(wait=False, cancel_futures=True)


def _quiet(_line: str) -> None:
    """The drain's progress lines: the replica's record keeps its outcome."""
