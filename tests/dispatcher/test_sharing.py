"""The rule between models of one engine (dispatcher.sharing) and the engine's state
counting the jobs of all of them (dispatcher.endpoints), on hand-made cases; and
dispatcher replicas owning such models as one, against a real Redis."""

from __future__ import annotations

import asyncio
import dataclasses

from redis.asyncio import Redis

from broker import DispatchStore, Grant, JobQueue, ModelSnapshot, keys
from dispatcher.admission import ADMISSION, AdmissionConfig
from dispatcher.endpoints import SentLog, endpoint_states
from dispatcher.service import Dispatcher
from dispatcher.sharing import next_turn
from dispatcher.wake import WakeListener
from tests.support.contract import submission
from tests.support.eventually import aeventually
from tests.support.settings import make_settings

ORDER = ["base", "lora-a", "lora-b"]


def turns(tops: dict[str, int], count: int, after: str | None = None) -> list[str]:
    served = []
    for _ in range(count):
        after = next_turn(ORDER, tops, after)
        assert after is not None
        served.append(after)
    return served


def test_backlogged_models_take_the_engine_in_turn_one_job_each() -> None:
    assert turns({"base": 1, "lora-a": 1, "lora-b": 1}, 6) == ORDER * 2


def test_the_turn_goes_on_after_the_model_served_last() -> None:
    assert turns({"base": 1, "lora-b": 1}, 3, after="base") == ["lora-b", "base", "lora-b"]
    # A model served last that has no backlog now still marks where the turn goes on.
    assert next_turn(ORDER, {"base": 1, "lora-b": 1}, "lora-a") == "lora-b"


def test_the_most_urgent_band_of_any_model_goes_first() -> None:
    tops = {"base": 1, "lora-a": 0, "lora-b": 2}  # lora-a has interactive jobs queued
    assert turns(tops, 3) == ["lora-a"] * 3


def test_a_model_without_room_waits_and_its_band_still_holds_less_urgent_ones_back() -> None:
    tops = {"base": 0, "lora-a": 0, "lora-b": 1}
    assert next_turn(ORDER, tops, None, done={"base"}) == "lora-a"
    assert next_turn(ORDER, tops, None, done={"base", "lora-a"}) is None
    assert next_turn(ORDER, {}, None) is None


def test_the_engine_state_counts_the_jobs_of_every_model_it_serves() -> None:
    a = ModelSnapshot([], {"http://e": 2, "http://f": 1}, {"http://e": 1})
    b = ModelSnapshot([], {"http://e": 3}, {"http://e": 2})
    states = endpoint_states(
        ["http://e", "http://f"], a, None, SentLog(5.0), now=0.0, stale_s=2.0, others=[b]
    )
    assert [(s.inflight, s.unstarted) for s in states] == [(5, 3), (1, 0)]
    # The static cap of 6 per endpoint is the engine's: one more job, not four.
    config = AdmissionConfig({"default": 3}, 0.15, inflight_cap=6)
    assert ADMISSION["static"].decide(states[0], "default", config).room == 1
    alone = endpoint_states(["http://e"], a, None, SentLog(5.0), now=0.0, stale_s=2.0)
    assert ADMISSION["static"].decide(alone[0], "default", config).room == 4


async def test_replicas_own_the_models_of_one_engine_together(redis_url: str) -> None:
    engine, other = "http://127.0.0.1:9", "http://127.0.0.1:19"
    models = [
        {"name": "base", "endpoints": [engine]},
        {"name": "solo", "endpoints": [other]},
        {"name": "base-lora", "endpoints": [engine]},
    ]
    settings = make_settings(redis_url, models=models, dispatcher_lease_ms=300)
    stop = asyncio.Event()
    async with Redis.from_url(redis_url) as r:
        replicas = [Dispatcher(settings, r), Dispatcher(settings, r)]
        tasks = [asyncio.create_task(d.run(stop)) for d in replicas]

        def split() -> bool:
            return all(d.owned for d in replicas)  # two leases (engines), one each

        try:
            await aeventually(split, "both replicas to own an engine", 5, interval_s=0.02)
            owned = sorted(sorted(d.owned) for d in replicas)
            assert owned == [["base", "base-lora"], ["solo"]]
            # One lease for the engine, the first model's: none of its own for the adapter.
            assert await r.get(keys.owner("base")) is not None
            assert await r.get(keys.owner("base-lora")) is None
        finally:
            stop.set()
            await asyncio.gather(*tasks)


async def test_a_loop_that_is_no_longer_its_engines_ends_instead_of_dispatching(
    aredis: Redis, redis_url: str
) -> None:
    # A loop cancelled when its lease was lost may have had the cancel swallowed (by a
    # library awaited at that moment, or Python 3.11's wait_for as its event fires); it
    # must not go on beside the loop that replaced it: they share the models' views.
    engine = "http://127.0.0.1:9"
    names = ["base", "lora"]
    models = [{"name": n, "endpoints": [engine], "admission": "static"} for n in names]
    settings = make_settings(redis_url, models=models, express_grant_ttl_s=0)
    dispatcher = Dispatcher(settings, aredis)
    for name in names:
        await DispatchStore(aredis, settings).ensure_ready_group(name)
    queue = JobQueue(aredis, settings)
    await queue.submit(dataclasses.replace(submission("u"), model="base"))
    group = settings.models
    wake = WakeListener(aredis, names, together=[names])
    async with asyncio.timeout(5):  # the engine has no loop registered: this is not it
        await dispatcher._model_loop(group, wake, asyncio.Event())
    assert dispatcher.dispatched == 0
    # Registered, the same loop dispatches the job, then ends when it is replaced.
    stop = asyncio.Event()
    loop = asyncio.create_task(dispatcher._model_loop(group, wake, stop))
    dispatcher._loops["base"] = loop
    try:
        await aeventually(lambda: dispatcher.dispatched == 1, "the job dispatched", 5)
        dispatcher._loops["base"] = asyncio.create_task(asyncio.sleep(0))  # its successor
        wake.event("base").set()
        async with asyncio.timeout(5):
            await loop
    finally:
        stop.set()
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_models_sharing_an_engine_hold_no_express_grant(aredis: Redis) -> None:
    # A grant written before the models shared the engine (an older configuration) is
    # revoked at the first round: enqueue.lua would send on it into the shared room.
    engine = "http://127.0.0.1:9"
    models = [{"name": n, "endpoints": [engine], "admission": "static"} for n in ("a", "b")]
    settings = make_settings(None, models=models)
    store = DispatchStore(aredis, settings)
    assert await store.grant("b", Grant(engine, {"interactive": 3}), 0, 60_000)
    assert await aredis.hget(keys.meta("b"), keys.GRANT_ENDPOINT) == engine.encode()
    await Dispatcher(settings, aredis).dispatch_engine(settings.models, {})
    assert await aredis.hget(keys.meta("b"), keys.GRANT_ENDPOINT) is None


async def test_a_large_room_is_split_evenly_between_the_models_in_few_turns(
    aredis: Redis, redis_url: str
) -> None:
    # A static cap of 40 on one engine, 30 jobs queued under each of two names (ten users
    # each): one round sends 20 of each, a pass per turn rather than one job per turn.
    engine = "http://127.0.0.1:9"
    names = ("a", "b")
    models = [{"name": n, "endpoints": [engine], "admission": "static", "inflight_cap": 40}
              for n in names]  # fmt: skip
    settings = make_settings(redis_url, models=models, express_grant_ttl_s=0)
    queue = JobQueue(aredis, settings)
    for i in range(60):
        await queue.submit(dataclasses.replace(submission(f"u{i % 10}"), model=names[i % 2]))
    dispatcher = Dispatcher(settings, aredis)
    for name in names:
        await DispatchStore(aredis, settings).ensure_ready_group(name)
    assert await dispatcher.dispatch_engine(settings.models, {}) == 40
    sent = [int(await aredis.hget(keys.inflight(n), engine) or 0) for n in names]
    assert sent == [20, 20]
