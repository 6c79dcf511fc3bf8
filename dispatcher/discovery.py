"""Replicas found through DNS: every record of a model's name is one endpoint.

A Kubernetes headless Service has one record per ready pod, so a model's replicas can
be followed without API permissions. The pure part turns records into endpoint URLs
(``endpoint_urls``), keeps each model's live set, the listed endpoints first, then the
ones found (``LiveEndpoints``), says what changed (``Change``), how long to wait before
the next read (``read_delay``) and which record types to ask (``Families``).
``DnsDiscovery`` is the I/O: it reads the records of each model every ``interval_s`` and
hands a changed set to its caller, who scrapes what was added and stops admitting to what
was removed. Reads keep a fixed grid (``time_left``): the next starts an interval after the
previous one *started*, at once if that one overran, so a read's own time (tens of ms on a
busy loop) does not push every later read back.

A model that is waking -- requests queued and no healthy endpoint: its replica is
starting -- is read every ``waking_interval_s`` instead, so its first replica is found
soon after its record appears; the caller says which models wake (``waking``) and cuts a
long wait short when one starts to (``hurry``). An idle fleet reads no more than before.

Record types: a Service is single-stack (A or AAAA records only) or dual-stack (both, one
of each per pod), and its first family never changes while it exists. A read asks only
the types that had records at the last read that found any (one question instead of two
for a single-stack Service, at zero too); both until a type has answered, every
``FULL_READ_EVERY`` reads (a Service made anew with another family is found that late at
most), and in the same read when the types asked find none while the last read found
replicas: a half answer never removes a replica. A dual-stack Service has one record of
each family per pod: its A records alone are the endpoints (and only A is asked after
the first read), so that one engine is never counted, and admitted to, twice.

One read ends one of three ways:

* records: the endpoints they name;
* the name does not exist (NXDOMAIN) or has no A or AAAA record: zero endpoints. A
  headless Service with no ready pod answers so; the model's requests wait in the queue;
* the resolver failed (a timeout, no server answered, SERVFAIL): the last known set
  stands, since removing replicas on a broken DNS would stop a healthy fleet. Logged
  once when the failures begin and once when the records are read again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from broker import DiscoveryConfig, ModelConfig, nameserver_address, wait_event

log = logging.getLogger(__name__)

_RECORD_TYPES = (dns.rdatatype.A, dns.rdatatype.AAAA)
FULL_READ_EVERY = 10  # reads of the types that answered before, then one of both
# A read's time bound: within the interval, so a slow server never stacks reads up, and
# long enough for a resolver's retries to another server.
_MAX_LIFETIME_S = 5.0


def endpoint_urls(addresses: Iterable[str], scheme: str, port: int) -> tuple[str, ...]:
    """The base URL of each address, sorted and without repeats (IPv6 in brackets)."""
    urls = set()
    for address in addresses:
        ip = ipaddress.ip_address(address)
        host = f"[{ip.compressed}]" if ip.version == 6 else ip.compressed
        urls.add(f"{scheme}://{host}:{port}")
    return tuple(sorted(urls))


@dataclass(frozen=True)
class Change:
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    @classmethod
    def between(cls, old: Sequence[str], new: Sequence[str]) -> Change:
        return cls(
            tuple(u for u in new if u not in set(old)), tuple(u for u in old if u not in set(new))
        )

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


class LiveEndpoints:
    """Each model's endpoints now: the listed ones, then those found through DNS."""

    def __init__(self, models: Iterable[ModelConfig]) -> None:
        self._listed = {m.name: m.endpoints for m in models}
        self._live = dict(self._listed)
        self._models_of = _index(self._live)

    def of(self, model: str) -> tuple[str, ...]:
        return self._live.get(model, ())

    def models_of(self, endpoint: str) -> tuple[str, ...]:
        """The models ``endpoint`` serves now (asked at every scrape: an index, not a walk
        over every model)."""
        return self._models_of.get(endpoint, ())

    def found(self, model: str, urls: Sequence[str]) -> Change:
        """Record the endpoints found for ``model``; returns what changed in its live set."""
        new = tuple(dict.fromkeys((*self._listed.get(model, ()), *urls)))
        change = Change.between(self.of(model), new)
        if change:
            self._live[model] = new
            self._models_of = _index(self._live)
        return change


def _index(live: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    models_of: dict[str, list[str]] = {}
    for model, endpoints in live.items():
        for endpoint in endpoints:
            models_of.setdefault(endpoint, []).append(model)
    return {endpoint: tuple(models) for endpoint, models in models_of.items()}


def read_delay(found: DiscoveryConfig, waking: bool) -> float:
    """How long until the next read of a model's records: ``waking_interval_s`` while it
    wakes (never longer than ``interval_s``), else ``interval_s``."""
    return min(found.waking_interval_s, found.interval_s) if waking else found.interval_s


def time_left(began_s: float, now_s: float, delay_s: float) -> float:
    """How long to wait for the read due ``delay_s`` after the one that began at
    ``began_s``; 0 when it is due already (a read that overran: the next starts at once)."""
    return max(0.0, began_s + delay_s - now_s)


RecordType = dns.rdatatype.RdataType


@dataclass
class Families:
    """The record types one model's reads ask (module docstring). Pure."""

    answered: tuple[RecordType, ...] = ()  # the types with records at the last read with any
    reads: int = 0  # reads of ``answered`` alone since the last read of both
    zero: bool = True  # the last read found no record

    def to_ask(self) -> tuple[RecordType, ...]:
        if not self.answered or self.reads >= FULL_READ_EVERY:
            return _RECORD_TYPES
        return self.answered

    def confirm(self, asked: Sequence[RecordType]) -> tuple[RecordType, ...]:
        """The types still to ask when ``asked`` found none: the others, if the last read
        found replicas (they go only on a whole answer); none at zero (nothing to remove)."""
        return () if self.zero else tuple(k for k in _RECORD_TYPES if k not in asked)

    def record(self, asked: Sequence[RecordType], had: Iterable[RecordType]) -> None:
        """A read asked ``asked`` and found records of the types ``had``."""
        self.reads = 0 if set(asked) == set(_RECORD_TYPES) else self.reads + 1
        found = set(had)
        self.zero = not found
        if found:
            self.answered = tuple(kind for kind in _RECORD_TYPES if kind in found)


class ResolveFailed(Exception):
    """The records could not be read (not: there are none); the message says why."""


OnFound = Callable[[str, tuple[str, ...]], None]  # (model, endpoint URLs) after a good read


class DnsDiscovery:
    """Reads the records of every model with ``discovery``, each every ``interval_s``, or
    every ``waking_interval_s`` while ``waking(model)`` says it wakes."""

    def __init__(
        self,
        models: Sequence[ModelConfig],
        on_found: OnFound,
        waking: Callable[[str], bool] | None = None,
    ) -> None:
        self._models = [m for m in models if m.discovery is not None]
        self._on_found = on_found
        self._waking = waking
        self._failing: set[str] = set()  # models whose last read failed
        self._hurry = {m.name: asyncio.Event() for m in self._models}
        self._slow: set[str] = set()  # models waiting ``interval_s`` for their next read

    def hurry(self, model: str) -> None:
        """``model`` started to wake: if it waits ``interval_s`` now, read it at once (then
        every ``waking_interval_s`` while it wakes). A model already read often is left as
        it is: a burst of requests never makes a burst of reads."""
        if model in self._slow:
            self._hurry[model].set()

    async def run(self) -> None:
        """Follow every model until cancelled; failures never raise."""
        async with asyncio.TaskGroup() as tasks:
            for model in self._models:
                tasks.create_task(self._follow(model.name, _found(model)))

    async def _follow(self, model: str, found: DiscoveryConfig) -> None:
        resolver = make_resolver(found)
        families = Families()
        clock = asyncio.get_running_loop().time
        while True:
            began_s = clock()
            try:
                urls = await resolve(resolver, found, families)
            except ResolveFailed as exc:
                self._failed(model, found, str(exc))
            else:
                self._recovered(model, found)
                self._hand_on(model, urls)
            await self._wait(model, found, began_s)

    async def _wait(self, model: str, found: DiscoveryConfig, began_s: float) -> None:
        """Until the next read of ``model``: due an interval after the read that began at
        ``began_s`` (the grid), or at once when ``hurry`` says it started to wake."""
        now_s = asyncio.get_running_loop().time()
        if self._is_waking(model):
            await asyncio.sleep(time_left(began_s, now_s, read_delay(found, waking=True)))
            return
        hurry = self._hurry[model]
        hurry.clear()
        self._slow.add(model)
        try:
            await wait_event(hurry, time_left(began_s, now_s, read_delay(found, waking=False)))
        finally:
            self._slow.discard(model)

    def _is_waking(self, model: str) -> bool:
        if self._waking is None:
            return False
        try:
            return self._waking(model)
        except Exception:
            log.exception("waking(%r) failed", model)  # read at the usual interval
            return False

    def _hand_on(self, model: str, urls: tuple[str, ...]) -> None:
        try:
            self._on_found(model, urls)
        except Exception:
            # A bug in the consumer must not stop the following of every model.
            log.exception("on_found(%r) failed", model)

    def _failed(self, model: str, found: DiscoveryConfig, reason: str) -> None:
        if model not in self._failing:
            log.warning(
                "replicas of model %s: DNS %s cannot be read (%s); its last known endpoints "
                "stay until it can",
                model,
                found.dns,
                reason,
            )
        self._failing.add(model)

    def _recovered(self, model: str, found: DiscoveryConfig) -> None:
        if model in self._failing:
            self._failing.discard(model)
            log.info("replicas of model %s: DNS %s is read again", model, found.dns)


def _found(model: ModelConfig) -> DiscoveryConfig:
    assert model.discovery is not None  # DnsDiscovery keeps only such models
    return model.discovery


def make_resolver(found: DiscoveryConfig) -> dns.asyncresolver.Resolver:
    """The system's resolver configuration, or only the nameservers ``found`` names."""
    resolver = dns.asyncresolver.Resolver(configure=not found.nameservers)
    if found.nameservers:
        resolver.nameservers = [
            dns.nameserver.Do53Nameserver(*nameserver_address(server))
            for server in found.nameservers
        ]
    resolver.lifetime = min(found.interval_s, _MAX_LIFETIME_S)
    resolver.timeout = resolver.lifetime / 2  # per server: leaves time for a second one
    return resolver


async def resolve(
    resolver: dns.asyncresolver.Resolver,
    found: DiscoveryConfig,
    families: Families | None = None,
) -> tuple[str, ...]:
    """The endpoint URLs of ``found``'s A records now, else of its AAAA records; () when
    the name has neither.
    ``families`` (kept between one model's reads) says which types to ask and learns
    which answered; None asks both. Raises ``ResolveFailed`` when any question failed: a
    part of the answer could remove replicas that are there."""
    families = families or Families()
    asked = families.to_ask()
    reads = await _ask(resolver, found.dns, asked)
    rest = () if any(reads) else families.confirm(asked)
    if rest:
        asked, reads = (*asked, *rest), reads + await _ask(resolver, found.dns, rest)
    by_kind = {kind: got for kind, got in zip(asked, reads, strict=True) if got}
    # One family: a dual-stack Service's pods have a record of each (module docstring).
    used = next((kind for kind in _RECORD_TYPES if kind in by_kind), None)
    families.record(asked, () if used is None else (used,))
    addresses = by_kind[used] if used is not None else ()
    return endpoint_urls(addresses, found.scheme, found.port)


async def _ask(
    resolver: dns.asyncresolver.Resolver, name: str, kinds: Sequence[RecordType]
) -> list[list[str]]:
    return list(await asyncio.gather(*(_addresses(resolver, name, kind) for kind in kinds)))


async def _addresses(
    resolver: dns.asyncresolver.Resolver, name: str, kind: dns.rdatatype.RdataType
) -> list[str]:
    try:
        # search: a short name ("engine-llama.fairq") is completed as the system's resolver
        # would (the pod's search domains); an absolute one ("...local.") is asked as it is.
        answer = await resolver.resolve(name, kind, search=True, raise_on_no_answer=False)
    except dns.resolver.NXDOMAIN:
        return []
    except dns.exception.DNSException as exc:
        raise ResolveFailed(f"{kind.name}: {exc}") from exc
    return [rdata.address for rdata in answer.rrset or ()]
