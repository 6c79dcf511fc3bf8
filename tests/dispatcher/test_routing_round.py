"""A dispatcher round under prefix routing, against Redis: each user's jobs go to their
replica, within the load bound, and no express grant is written."""

from __future__ import annotations

from redis.asyncio import Redis

from broker import JobQueue, Settings, keys
from dispatcher.affinity import rendezvous
from dispatcher.service import Dispatcher
from tests.support.contract import MODEL, submission
from tests.support.settings import make_settings

EPS = ("http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11")
USERS = [f"user-{i}" for i in range(9)]


def _settings(routing: str, load_bound: float, cap: int) -> Settings:
    fields = {"admission": "static", "inflight_cap": cap, "routing": routing}
    return make_settings(
        "redis://unused",
        endpoints=EPS,
        model_fields=fields | {"routing_load_bound": load_bound},
    )


async def _round(  # noqa: PLR0917 (a test helper's knobs)
    r: Redis,
    routing: str,
    jobs_each: int,
    load_bound: float = 3.0,
    cap: int = 8,
    users: list[str] = USERS,
) -> dict[str, list[str]]:
    """Each user's jobs queued, one dispatch: user -> the endpoints their jobs went to."""
    s = _settings(routing, load_bound, cap)
    queue = JobQueue(r, s)
    for user in users:
        for _ in range(jobs_each):
            await queue.submit(submission(user))
    await Dispatcher(s, r).dispatch_model(s.models[0])
    placed: dict[str, list[str]] = {}
    for _, entry in await r.xrange(keys.ready(MODEL)) or []:
        assert entry is not None
        owner, endpoint = entry[b"u"], entry[b"ep"]
        assert isinstance(owner, bytes) and isinstance(endpoint, bytes)
        placed.setdefault(owner.decode(), []).append(endpoint.decode())
    return placed


async def test_prefix_routing_sends_each_users_jobs_to_their_rendezvous_replica(r: Redis) -> None:
    placed = await _round(r, "prefix", jobs_each=2, cap=20)  # room for any split
    assert sorted(placed) == USERS and all(len(eps) == 2 for eps in placed.values())
    for user, endpoints in placed.items():
        assert set(endpoints) == {rendezvous(user, EPS)[0]}, user
    # One grant is one endpoint: under prefix routing there is none.
    assert await r.hget(keys.meta(MODEL), "xep") is None


async def test_one_users_flood_spills_over_to_the_other_replicas_at_the_bound(
    r: Redis,
) -> None:
    placed = await _round(r, "prefix", jobs_each=12, load_bound=1.0, cap=20, users=["flood"])
    sent = placed["flood"]
    assert [sent.count(ep) for ep in EPS] == [4, 4, 4]  # never above the mean
    assert sent[0] == rendezvous("flood", EPS)[0]  # its own replica first


async def test_least_loaded_fills_the_endpoint_with_most_room_and_grants_express(
    r: Redis,
) -> None:
    placed = await _round(r, "least_loaded", jobs_each=1)
    sent = [ep for eps in placed.values() for ep in eps]
    assert (sent.count(EPS[0]), sent.count(EPS[1])) == (8, 1)  # the cap, then the next
    assert await r.hget(keys.meta(MODEL), "xep") is not None


async def test_a_model_with_one_replica_keeps_express_under_prefix_routing(r: Redis) -> None:
    fields = {"admission": "static", "routing": "prefix"}
    s = make_settings("redis://unused", endpoints=EPS[:1], model_fields=fields)
    await Dispatcher(s, r).dispatch_model(s.models[0])
    assert await r.hget(keys.meta(MODEL), "xep") == EPS[0].encode()
