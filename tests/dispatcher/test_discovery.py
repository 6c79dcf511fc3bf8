"""Replicas found through DNS (``dispatcher.discovery``): records to endpoint URLs and to
what changed, the delay to the next read and the record types asked (pure), and reads of
a real DNS server on 127.0.0.1: records, a name with none or none at all (zero
endpoints), a failing or silent server (the last set stands, logged once per change of
state), one question a read for a single-stack name, reads every waking interval while a
model wakes, on a fixed grid however long a read takes."""

from __future__ import annotations

import asyncio
import itertools
import logging
import statistics
import time

import pytest
from dns.rdatatype import AAAA, A

from broker import DiscoveryConfig, ModelConfig
from dispatcher.discovery import (
    FULL_READ_EVERY,
    Change,
    DnsDiscovery,
    Families,
    LiveEndpoints,
    ResolveFailed,
    endpoint_urls,
    make_resolver,
    read_delay,
    resolve,
    time_left,
)
from dispatcher.endpoints import SentLog
from tests.support.dns import dns_server, silent_dns
from tests.support.eventually import aeventually

NAME = "engine-llama.fairq.svc.cluster.local"


def test_each_address_is_one_endpoint_sorted_without_repeats() -> None:
    urls = endpoint_urls(["10.0.0.9", "fd00::0:7", "10.0.0.10", "10.0.0.9"], "http", 8000)
    assert urls == ("http://10.0.0.10:8000", "http://10.0.0.9:8000", "http://[fd00::7]:8000")
    assert endpoint_urls([], "https", 443) == ()


def test_a_change_names_the_endpoints_added_and_removed() -> None:
    change = Change.between(("http://a:1", "http://b:1"), ("http://b:1", "http://c:1"))
    assert change == Change(added=("http://c:1",), removed=("http://a:1",))
    assert not Change.between(("http://a:1",), ("http://a:1",))


def _model(name: str, endpoints: tuple[str, ...] = ()) -> ModelConfig:
    found = DiscoveryConfig(dns=NAME, port=8000)
    return ModelConfig(name=name, endpoints=endpoints, discovery=found)


def test_the_live_set_is_the_listed_endpoints_then_those_found() -> None:
    live = LiveEndpoints([_model("a", ("http://10.0.0.1:8000",)), _model("b")])
    assert live.of("a") == ("http://10.0.0.1:8000",)
    assert live.of("b") == ()
    change = live.found("a", ("http://10.0.0.1:8000", "http://10.0.0.2:8000"))
    assert change == Change(added=("http://10.0.0.2:8000",))
    assert live.of("a") == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    live.found("b", ("http://10.0.0.2:8000",))
    assert live.models_of("http://10.0.0.2:8000") == ("a", "b")
    # Records gone: the listed endpoint stays, the found one leaves both indexes.
    assert live.found("a", ()) == Change(removed=("http://10.0.0.2:8000",))
    assert live.of("a") == ("http://10.0.0.1:8000",)
    assert live.models_of("http://10.0.0.2:8000") == ("b",)
    assert not live.found("a", ())


def _found(server: str, interval_s: float = 5.0) -> DiscoveryConfig:
    return DiscoveryConfig(dns=NAME, port=8000, interval_s=interval_s, nameservers=(server,))


async def test_a_read_gives_every_record_of_one_family_as_an_endpoint() -> None:
    with dns_server() as (zone, server):
        found = _found(server)
        resolver = make_resolver(found)
        zone.set(NAME, ["fd00::5", "fd00::4"])  # single-stack IPv6
        assert await resolve(resolver, found) == ("http://[fd00::4]:8000", "http://[fd00::5]:8000")
        # Dual-stack: two pods, each with an A and an AAAA record, are two engines, not four.
        zone.set(NAME, ["10.1.0.5", "10.1.0.4", "fd00::5", "fd00::4"])
        urls = await resolve(make_resolver(found), found)
    assert urls == ("http://10.1.0.4:8000", "http://10.1.0.5:8000")


async def test_a_name_without_records_or_gone_is_zero_endpoints_not_an_error() -> None:
    with dns_server() as (zone, server):
        found = _found(server)
        resolver = make_resolver(found)
        zone.set(NAME, [])  # a headless Service with no ready pod
        assert await resolve(resolver, found) == ()
        zone.remove(NAME)  # NXDOMAIN
        assert await resolve(resolver, found) == ()
        assert zone.questions >= 4  # each read asked, A and AAAA


async def test_a_failing_or_silent_server_is_a_failure_not_zero_endpoints() -> None:
    with dns_server() as (zone, server):
        zone.set(NAME, ["10.1.0.4"])
        zone.servfail = True
        found = _found(server)
        with pytest.raises(ResolveFailed, match="All nameservers failed"):
            await resolve(make_resolver(found), found)
    with silent_dns() as silent:
        found = _found(silent, interval_s=0.3)  # the read's time bound is the interval
        with pytest.raises(ResolveFailed, match="lifetime expired"):
            await resolve(make_resolver(found), found)


async def test_discovery_keeps_the_last_set_through_failures_and_logs_each_change_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dispatcher.discovery")
    seen: list[tuple[str, tuple[str, ...]]] = []
    with dns_server() as (zone, server):
        zone.set(NAME, ["10.1.0.4"])
        model = ModelConfig(name="llama", discovery=_found(server, interval_s=0.05))
        task = asyncio.create_task(DnsDiscovery([model], lambda m, u: seen.append((m, u))).run())
        try:
            await aeventually(lambda: len(seen) >= 1, "a first read")
            assert seen[0] == ("llama", ("http://10.1.0.4:8000",))
            zone.servfail = True
            asked = zone.questions
            await aeventually(lambda: zone.questions >= asked + 8, "four failed reads")
            during = len(seen)
            await asyncio.sleep(0.2)
            assert len(seen) == during  # no set handed on while it fails: the last stands
            zone.servfail = False
            zone.set(NAME, ["10.1.0.4", "10.1.0.6"])
            await aeventually(lambda: seen[-1][1][-1:] == ("http://10.1.0.6:8000",), "read")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("cannot be read" in m for m in messages) == 1, messages
    assert sum("is read again" in m for m in messages) == 1, messages


def test_a_gone_replicas_sends_are_forgotten() -> None:
    sent = SentLog(keep_s=10)
    sent.record("http://10.0.0.1:8000", 3, now=1.0)
    sent.forget("http://10.0.0.1:8000")
    assert sent.since("http://10.0.0.1:8000", 0.0).total == 0
    assert not sent._sent  # nothing kept per replica that came and went


def test_a_waking_model_is_read_at_its_waking_interval_never_slower_than_the_usual() -> None:
    found = DiscoveryConfig(dns=NAME, port=8000, interval_s=5.0, waking_interval_s=0.2)
    assert read_delay(found, waking=False) == 5.0
    assert read_delay(found, waking=True) == 0.2
    quick = DiscoveryConfig(dns=NAME, port=8000, interval_s=0.1, waking_interval_s=0.2)
    assert read_delay(quick, waking=True) == 0.1


def test_reads_ask_the_record_type_that_answered_and_both_now_and_then() -> None:
    families = Families()
    assert families.to_ask() == (A, AAAA)  # nothing known yet
    families.record((A, AAAA), [A])  # a single-stack IPv4 Service
    for _ in range(FULL_READ_EVERY):
        assert families.to_ask() == (A,)
        assert families.confirm((A,)) == (AAAA,)  # replicas go only on a whole answer
        families.record((A,), [A])
    assert families.to_ask() == (A, AAAA)  # a Service made anew with AAAA is seen
    families.record((A, AAAA), [A])  # dual-stack: resolve keeps A, the family it used
    assert families.to_ask() == (A,)
    families.record((A, AAAA), [AAAA])
    assert families.to_ask() == (AAAA,)
    families.record((AAAA, A), [])  # none of either: the model is at zero
    assert families.to_ask() == (AAAA,)  # the Service's family stays known
    assert families.confirm((AAAA,)) == ()  # at zero a half answer removes nothing


async def test_a_single_stack_name_costs_one_question_a_read_at_zero_too() -> None:
    with dns_server() as (zone, server):
        zone.set(NAME, ["10.1.0.4"])
        found = _found(server)
        resolver, families = make_resolver(found), Families()
        assert await resolve(resolver, found, families) == ("http://10.1.0.4:8000",)
        assert zone.questions == 2
        assert await resolve(resolver, found, families) == ("http://10.1.0.4:8000",)
        assert zone.questions == 3  # A only
        zone.set(NAME, ["fd00::5"])  # A gone, AAAA there: the same read asks AAAA too
        assert await resolve(resolver, found, families) == ("http://[fd00::5]:8000",)
        assert zone.questions == 5
        assert await resolve(resolver, found, families) == ("http://[fd00::5]:8000",)
        assert zone.questions == 6  # AAAA only
        zone.set(NAME, [])
        assert await resolve(resolver, found, families) == ()  # confirmed by both
        assert zone.questions == 8
        assert await resolve(resolver, found, families) == ()
        assert zone.questions == 9  # at zero: AAAA only
        zone.set(NAME, ["fd00::6"])
        assert await resolve(resolver, found, families) == ("http://[fd00::6]:8000",)


async def test_a_waking_model_is_read_often_from_the_hurry_on_and_slowly_after() -> None:
    waking = False
    with dns_server() as (zone, server):
        zone.set(NAME, [])
        found = DiscoveryConfig(dns=NAME, port=8000, interval_s=30.0, waking_interval_s=0.05,
                                nameservers=(server,))  # fmt: skip
        model = ModelConfig(name="llama", discovery=found)
        discovery = DnsDiscovery([model], lambda m, u: None, waking=lambda m: waking)
        task = asyncio.create_task(discovery.run())
        try:
            await aeventually(lambda: zone.questions >= 2, "the first read")
            await asyncio.sleep(0.2)
            asked = zone.questions
            discovery.hurry("llama")  # not waking: a read now, then the usual interval
            await aeventually(lambda: zone.questions >= asked + 2, "a read at once")
            await asyncio.sleep(0.3)
            assert zone.questions == asked + 2
            waking = True
            discovery.hurry("llama")
            await aeventually(lambda: zone.questions >= asked + 20, "reads every 0.05 s", 3)
            for _ in range(50):  # a burst of requests is no burst of reads
                discovery.hurry("llama")
            waking = False
            await asyncio.sleep(0.2)  # the read under way ends, then the 30 s wait
            stopped = zone.questions
            await asyncio.sleep(0.4)
            assert zone.questions == stopped
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def test_the_next_read_is_due_an_interval_after_the_last_began_at_once_if_it_overran() -> None:
    assert time_left(began_s=10.0, now_s=10.03, delay_s=0.1) == pytest.approx(0.07)
    assert time_left(began_s=10.0, now_s=10.1, delay_s=0.1) == 0.0
    assert time_left(began_s=10.0, now_s=10.25, delay_s=0.1) == 0.0  # overran: at once


async def _gaps_between_reads(found: DiscoveryConfig, busy_s: float, waking: bool) -> list[float]:
    """The time between the starts of ten reads' hand-overs, each of which blocks the
    loop ``busy_s`` (a busy dispatcher)."""
    began: list[float] = []

    def on_found(model: str, urls: tuple[str, ...]) -> None:
        began.append(time.monotonic())
        time.sleep(busy_s)

    model = ModelConfig(name="llama", discovery=found)
    task = asyncio.create_task(DnsDiscovery([model], on_found, waking=lambda m: waking).run())
    try:
        await aeventually(lambda: len(began) >= 11, "eleven reads", 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return [b - a for a, b in itertools.pairwise(began)][:10]


@pytest.mark.parametrize("waking", [True, False], ids=["waking", "usual"])
async def test_reads_keep_their_grid_when_each_read_takes_a_while(waking: bool) -> None:
    # Reads once slept the interval after a 40 ms hand-over, 0.14 s apart; on the grid
    # they stay 0.1 s apart.
    with dns_server() as (zone, server):
        zone.set(NAME, ["10.1.0.4"])
        found = DiscoveryConfig(dns=NAME, port=8000, nameservers=(server,),
                                interval_s=30.0 if waking else 0.1,
                                waking_interval_s=0.1)  # fmt: skip
        gaps = await _gaps_between_reads(found, busy_s=0.04, waking=waking)
    assert 0.09 <= statistics.median(gaps) < 0.12, gaps


async def test_a_read_that_overran_its_interval_is_followed_by_the_next_at_once() -> None:
    with dns_server() as (zone, server):
        zone.set(NAME, ["10.1.0.4"])
        found = DiscoveryConfig(dns=NAME, port=8000, interval_s=30.0, waking_interval_s=0.05,
                                nameservers=(server,))  # fmt: skip
        gaps = await _gaps_between_reads(found, busy_s=0.08, waking=True)
    # 0.08 s of work (over the 0.05 s interval) and a read: no wait on top (once 0.13 s).
    assert 0.08 <= statistics.median(gaps) < 0.115, gaps
