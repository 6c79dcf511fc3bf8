"""A tenant's quota under a burst: 200 clients at once through two gateway processes
(``fairq api``), against a daily limit of a few dozen requests' worth, one Redis with its
append-only file, the dispatcher and two workers in the test's loop. What is admitted
never passes the limit by more than one request's worth (the estimate is charged in the
call that queues the job, on whichever gateway); once every job has ended the counters
hold exactly the usage the workers recorded, one request each. They still do after a
gateway is killed and Redis is killed and started again on its files, once the burst is
over (the next answer's headers say what is left, to the token) and while its jobs run.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any, NamedTuple

import httpx
import orjson
import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from broker import Settings, keys
from fairq.stack.localredis import LocalRedis, free_port
from sim import SimProfile
from tests.support.eventually import WAIT_S, aeventually
from tests.support.quota import day_left_s, redis_now_ms
from tests.support.settings import MODEL, api_key, make_config
from tests.support.stack import FAST, WorkerProcesses, components, sim

pytestmark = pytest.mark.integration

CLIENTS = 200
USERS = [f"member-{i}" for i in range(4)]  # four users of one tenant, a key each
MESSAGES: Any = [{"role": "user", "content": "count to eight"}]
MAX_TOKENS = 8
ESTIMATE = len(orjson.dumps(MESSAGES)) // 4 + MAX_TOKENS  # one request's worth
LIMIT = 30 * ESTIMATE + ESTIMATE // 2  # not a whole number of requests
BODY = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS}
MEMBER = {"Authorization": f"Bearer k-{USERS[0]}"}


@pytest.fixture
def server() -> Iterator[LocalRedis]:
    with LocalRedis() as running:  # appendonly, fsync every second
        yield running


@pytest.fixture
async def redis(server: LocalRedis) -> AsyncIterator[Redis]:
    client = Redis.from_url(server.url)
    if day_left_s(await redis_now_ms(client)) < 60:  # the day's counters would start again
        pytest.skip("the UTC day ends within the test")
    yield client
    await client.aclose()


class Stack(NamedTuple):
    procs: WorkerProcesses
    ports: list[int]
    gateways: list[subprocess.Popen[bytes]]

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]


@contextlib.asynccontextmanager
async def stack(
    server: LocalRedis, profile: SimProfile = FAST, **config: Any
) -> AsyncIterator[Stack]:
    """The simulator, two ``fairq api`` processes, the dispatcher and two workers."""
    with sim(profile) as engine:
        keyed = [api_key(f"k-{user}", user, tenant="lab") for user in USERS]
        quotas = [{"tenant": "lab", "tokens_per_day": LIMIT}]
        whole = make_config([engine], quick=True, api_keys=keyed, quotas=quotas, **config)
        procs = WorkerProcesses(whole, server.url)
        ports = [free_port(), free_port()]
        try:
            gateways = [procs.spawn_gateway(port) for port in ports]
            async with components(Settings(redis_url=server.url, **whole), workers=2):
                yield Stack(procs, ports, gateways)
        finally:
            procs.close()


async def burst(urls: list[str]) -> list[httpx.Response | BaseException]:
    """``CLIENTS`` requests at once, alternately to each gateway, each with a member's key."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=WAIT_S, limits=limits) as http:
        calls = [
            http.post(
                f"{urls[i % len(urls)]}/v1/chat/completions",
                json=BODY,
                headers={"Authorization": f"Bearer k-{USERS[i % len(USERS)]}"},
            )
            for i in range(CLIENTS)
        ]
        return list(await asyncio.gather(*calls, return_exceptions=True))


async def recorded(redis: Redis) -> tuple[int, Counter[str]]:
    """The tokens of the usage every job recorded, and the jobs' states."""
    tokens, states = 0, Counter[str]()
    async for key in redis.scan_iter(match=keys.job_pattern(MODEL)):
        job = await redis.hgetall(key)
        states[job[b"st"].decode()] += 1
        usage = orjson.loads(job.get(b"usage", b"{}"))
        tokens += usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return tokens, states


async def counted(redis: Redis) -> tuple[int, int]:
    """The tenant's counters of today: tokens and requests."""
    quota = await redis.hgetall(keys.tenant_quota("lab"))
    return int(quota[b"dt"]), int(quota[b"dr"])


def restart(server: LocalRedis) -> None:
    """Redis killed (SIGKILL) and started again on its files."""
    server.halt(kill=True)
    server.start()


@pytest.mark.timeout(60)
async def test_a_burst_through_two_gateways_never_passes_a_quota_and_counts_exactly(
    server: LocalRedis, redis: Redis
) -> None:
    async with stack(server) as running:
        answers = [a for a in await burst(running.urls) if isinstance(a, httpx.Response)]
        tokens, requests = await counted(redis)
        in_jobs, states = await recorded(redis)
        # A gateway killed and started again, then Redis killed and started on its files:
        # the counters are as they were, and the next answer says so to the token.
        running.gateways[0].kill()
        running.gateways[0].wait(10)
        running.procs.spawn_gateway(running.ports[0])
        restart(server)
        after = await aeventually(lambda: counted(redis), "Redis back", ignoring=(RedisError,))
        async with httpx.AsyncClient(base_url=running.urls[0], timeout=WAIT_S) as http:
            next_answer = await aeventually(
                lambda: http.post("/v1/chat/completions", json=BODY, headers=MEMBER),
                "an answer once Redis is back",
                until=lambda r: r.status_code in (200, 429),
            )
    statuses = Counter(a.status_code for a in answers)
    admitted = [a for a in answers if a.status_code == 200]
    answered = sum(a.json()["usage"]["total_tokens"] for a in admitted)
    print(
        f"\n{CLIENTS} clients, limit {LIMIT} tokens a day ({ESTIMATE} a request estimated): "
        f"answers {dict(statuses)}; admitted {len(admitted)} jobs, {answered} tokens used; "
        f"counted {tokens} tokens, {requests} requests"
    )
    assert len(answers) == CLIENTS and set(statuses) == {200, 429}, statuses
    refused = [a for a in answers if a.status_code == 429]
    assert all(a.json()["error"]["code"] == "rate_limit_exceeded" for a in refused)
    assert all(int(a.headers["retry-after"]) > 0 for a in refused)
    # Admitted: never more than the limit and one request's worth (here: never more than
    # the limit, as the estimates charged are at least the usage that replaces them).
    assert answered <= LIMIT + ESTIMATE and len(admitted) >= LIMIT // ESTIMATE
    # Exact: the counters are the sum of the usage every job recorded, one request each.
    assert states == {"completed": len(admitted)}
    assert (tokens, requests) == (in_jobs, len(admitted)) and in_jobs == answered
    assert after == (tokens, requests)  # ... across the restarts
    left = LIMIT - tokens - (ESTIMATE if next_answer.status_code == 200 else 0)
    assert next_answer.headers["x-ratelimit-remaining-tokens"] == str(max(0, left))
    assert next_answer.headers["x-ratelimit-limit-tokens"] == str(LIMIT)


# Jobs that last: a few hundred ms each, four at a time in the engine.
SLOW = SimProfile(step_base_ms=40.0, step_per_seq_ms=0.5, max_num_seqs=4, default_output_tokens=8)
# The workers' leases outlast Redis's restart: their jobs stay theirs and end once.
LEASES = {"lease_ms": 15_000, "lease_renew_ms": 3_000}


@pytest.mark.timeout(60)
async def test_the_counters_stay_exact_through_a_gateway_and_redis_killed_while_jobs_run(
    server: LocalRedis, redis: Redis
) -> None:
    async with stack(server, SLOW, **LEASES) as running:
        clients = asyncio.create_task(burst(running.urls))

        async def running_jobs() -> bool:
            _, states = await recorded(redis)
            return states["completed"] > 0 and states["completed"] < states.total()

        await aeventually(running_jobs, "some of the burst's jobs ended, others not yet")
        running.gateways[0].kill()  # its clients are cut off; their jobs run on
        restart(server)
        answers = await clients

        async def all_ended() -> Counter[str]:
            return (await recorded(redis))[1]

        states = await aeventually(
            all_ended,
            "every job ended",
            until=lambda s: s and set(s) == {"completed"},
            ignoring=(RedisError,),
        )
        tokens, requests = await counted(redis)
        in_jobs, _ = await recorded(redis)
    outcomes = Counter(
        a.status_code if isinstance(a, httpx.Response) else type(a).__name__ for a in answers
    )
    print(
        f"\nkilled mid-burst: client outcomes {dict(outcomes)}; jobs {dict(states)}; "
        f"{in_jobs} tokens used, counted {tokens} tokens, {requests} requests"
    )
    assert outcomes[200] > 0 and outcomes[429] > 0
    assert in_jobs <= LIMIT + ESTIMATE
    assert (tokens, requests) == (in_jobs, states.total())
