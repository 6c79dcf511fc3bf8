"""Wake-ups for the model loops: one pub/sub subscription per process.

The enqueue, complete and cancel scripts publish on ``fq:{m}:wake``. Each
message sets the model's event; a message that names a newly backlogged user
is also kept as a hint, so the loop can plan from its cached view plus the
hints instead of reading the backlog again. Any other change, and a lost
connection, marks the cached view stale. An express send (a job enqueue.lua
sent straight to an endpoint) is also reported to ``on_express`` at once, so
admission counts it before the engine's metrics can show it. Every message that says a
job came (queued, or sent express) is then reported to ``on_queued``: a model whose
demand was 0 is published and its replicas are read at once rather than at their next
period (``dispatcher.publisher``, ``dispatcher.discovery``).

Models that share an engine are dispatched by one loop (``dispatcher.service``): their
wake-ups set one event (``together``), so that loop waits on one thing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import ExpressSend, Newcomer, express_send, keys, parse_wake
from broker.process.backoff import Backoff

log = logging.getLogger(__name__)

_MAX_HINTS = 1000  # newcomers kept per model between two rounds


@dataclass
class _ModelWake:
    model: str
    event: asyncio.Event = field(default_factory=asyncio.Event)
    newcomers: list[Newcomer] = field(default_factory=list)
    stale: bool = True  # nothing is known until the first read
    urgent: bool = True  # a job was queued (or the state is unknown) since the last round


class WakeListener:
    def __init__(
        self,
        redis: Redis,
        models: Sequence[str],
        on_express: Callable[[str, ExpressSend], None] | None = None,  # (model, the send)
        together: Sequence[Sequence[str]] = (),  # models whose wake-ups set one event
        on_queued: Callable[[str], None] | None = None,  # (model): a job came
    ) -> None:
        self._redis = redis
        self._on_express = on_express
        self._on_queued = on_queued
        shared = {m: asyncio.Event() for group in together for m in group[:1]}
        event_of = {m: shared[group[0]] for group in together for m in group}
        self._by_channel = {
            keys.wake_channel(m).encode(): _ModelWake(m, event_of.get(m) or asyncio.Event())
            for m in models
        }
        self._by_model = {m: self._by_channel[keys.wake_channel(m).encode()] for m in models}

    def event(self, model: str) -> asyncio.Event:
        return self._by_model[model].event

    def take(self, model: str) -> list[Newcomer] | None:
        """The newcomers since the last call, or None when a cached view is stale."""
        wake = self._by_model[model]
        newcomers, wake.newcomers = wake.newcomers, []
        wake.urgent = False
        if wake.stale:
            wake.stale = False
            return None
        return newcomers

    def mark_stale(self, model: str) -> None:
        self._by_model[model].stale = True
        self._by_model[model].urgent = True

    def urgent(self, model: str) -> bool:
        """Whether a job was queued since the last ``take``: the other news (an express
        send, a job that started or ended, a scrape) only refreshes room and grants,
        which can wait a moment while nothing is queued."""
        return self._by_model[model].urgent

    async def run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self._listen()
            except RedisError as exc:
                log.warning("wake subscription lost (%s); resubscribing", exc)
                for wake in self._by_channel.values():
                    wake.stale = wake.urgent = True
                    wake.event.set()
                await backoff.wait()

    async def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(*self._by_channel)
            async for message in pubsub.listen():
                wake = self._by_channel.get(message["channel"])
                if wake is None:
                    continue
                newcomer = parse_wake(message["data"])
                sent = express_send(message["data"])
                if sent is not None and self._on_express is not None:
                    self._on_express(wake.model, sent)
                came = newcomer is not None or message["data"] == b"q"
                wake.urgent = wake.urgent or came
                if newcomer is None:
                    wake.stale = wake.stale or message["data"] != b"q"
                elif len(wake.newcomers) < _MAX_HINTS:
                    wake.newcomers.append(newcomer)
                else:  # nobody takes them (a model this replica does not own): forget
                    wake.newcomers.clear()
                    wake.stale = True
                wake.event.set()
                if (came or sent is not None) and self._on_queued is not None:
                    self._on_queued(wake.model)
        finally:
            await pubsub.aclose()
