"""The fleet benchmark's autoscaler: KEDA's rules (``keda``) on fairq's demand.

Every ``poll_s`` it reads the dispatcher's ``/metrics`` (the Prometheus text KEDA's
Prometheus scaler would get through Prometheus), takes each model's
``fairq_model_demand``, and brings each model's replicas to the count the rules give:
new ones are started (``Fleet.start``), surplus ones stopped (``Fleet.stop``: a replica
still starting goes first, as Kubernetes removes unready pods first, then the newest).
Each decision is logged with its time, for the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.fleet.keda import ModelScale, Rules, target
from benchmarks.fleet.replicas import Fleet, Replica

DEMAND = "fairq_model_demand{"


def demand_by_model(text: str) -> dict[str, float]:
    """Each model's ``fairq_model_demand`` in a Prometheus text exposition. A line scan,
    not a full parse: the dispatcher's page has every engine's series too, and this runs
    in the load's event loop."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(DEMAND):
            continue
        labels, _, value = line.rpartition("} ")
        start = labels.find('model="')
        if start < 0:
            continue
        model = labels[start + 7 : labels.index('"', start + 7)]
        out[model] = max(out.get(model, 0.0), float(value.split()[0]))  # max(), as the query
    return out


@dataclass
class Scaler:
    fleet: Fleet
    rules: Rules
    metrics_url: str  # the dispatcher's /metrics
    poll_s: float
    models: tuple[str, ...]
    states: dict[str, ModelScale] = field(default_factory=dict)
    polls: int = 0
    failed_polls: int = 0
    started: int = 0
    stopped: int = 0
    max_replicas_seen: int = 0  # starting or ready, all models together

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=5.0) as http:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    text = (await http.get(self.metrics_url)).text
                except httpx.HTTPError:
                    self.failed_polls += 1  # KEDA keeps the replicas on an error
                else:
                    self.apply(demand_by_model(text), time.monotonic())
                wait_s = max(0.0, self.poll_s - (time.monotonic() - began))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait_s)

    def apply(self, demand: dict[str, float], now_s: float) -> None:
        """One poll: each model to its target (a model without a series keeps its replicas,
        as KEDA does with ``ignoreNullValues: false``)."""
        self.polls += 1
        for model in self.models:
            if model not in demand:
                continue
            state = self.states.setdefault(model, ModelScale())
            wanted = target(state, demand[model], len(self.fleet.live(model)), now_s, self.rules)
            started, stopped = resize(self.fleet, model, wanted, cause="poll")
            self.started += started
            self.stopped += stopped
        self.max_replicas_seen = max(self.max_replicas_seen, replicas(self.fleet, self.models))


def replicas(fleet: Fleet, models: tuple[str, ...]) -> int:
    """Replicas starting or ready, all models together."""
    return sum(len(fleet.live(m)) for m in models)


def resize(fleet: Fleet, model: str, wanted: int, cause: str) -> tuple[int, int]:
    """Start or stop ``model``'s replicas to ``wanted`` (as the Deployment's controller
    does on a new replica count); ``cause`` names the path that decided (on each replica
    started). Returns how many were started and stopped."""
    live = fleet.live(model)
    for _ in range(wanted - len(live)):
        fleet.start(model, cause)
    victims = _victims(live, len(live) - wanted)
    for replica in victims:
        fleet.stop(replica)
    return max(0, wanted - len(live)), len(victims)


def _victims(live: list[Replica], count: int) -> list[Replica]:
    """Which replicas go: those not ready yet first, then the newest."""
    if count <= 0:
        return []
    order = sorted(live, key=lambda r: (r.state == "ready", -r.requested_s))
    return order[:count]
