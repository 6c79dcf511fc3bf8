"""Depth independence: enqueue and dispatch latency on an almost empty queue and with a
million jobs queued, side by side in one run, and Redis memory per queued job.

One model, one Redis (on the same machine), everything in this process; no dispatcher
process and no worker run, so what is timed is the broker's own work:

* **enqueue**: one ``JobQueue.submit`` (the gateway's call: ``enqueue.lua``, one round
  trip) to a random user of ``--users``, awaited alone.
* **dispatch round**: what one turn of the dispatcher's loop does with a backlog: plan
  64 fair picks (pure Python) and apply them with one ``dispatch.lua`` call, which also
  returns the state the next plan starts from.

Each phase runs ``--rounds`` rounds of (64 timed enqueues, one timed dispatch round),
so the depth stays where the phase put it: at most 64 jobs in the "empty" phase, and
``--jobs`` in the "deep" phase, after ``--jobs`` jobs were queued over ``--users`` users
(pipelined, untimed). Memory per queued job is the growth of Redis's ``used_memory``
over that fill, per job, minus the payload's bytes; MEMORY USAGE of each kind of key
shows where the bytes go.

Run with ``python -m benchmarks.depth`` (defaults: a quick run); the figures in
docs/performance.md are from ``--jobs 1000000``.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import click
import redis
from redis.asyncio import Redis

from benchmarks.stats import machine, markdown_table, median, pct, save
from broker import DispatchStore, JobQueue, RequestKind, Settings, Submission, connect, keys
from broker.jobs import new_job_id
from broker.scripts import Scripts
from dispatcher.fairness import policy
from fairq.localredis import LocalRedis

MODEL = "m0"
BAND = "default"
PICKS = 64  # picks per dispatch.lua call: the dispatcher's own maximum (_MAX_PICKS)
PAYLOAD = b'{"model":"m0","messages":[{"role":"user","content":"hello"}],"max_tokens":8}'
ENDPOINT = "http://127.0.0.1:9"
_FILL_CHUNK = 2000  # enqueue.lua calls per pipeline while filling


def settings_for(url: str) -> Settings:
    model = {"name": MODEL, "endpoints": [ENDPOINT], "admission": "static",
             "inflight_cap": 10**9}  # fmt: skip
    return Settings(redis_url=url, models=[model], max_queued_per_user=10**7)  # type: ignore[arg-type]


def submission(user: int) -> Submission:
    return Submission(
        model=MODEL, owner=f"u{user}", user=f"u{user}", tenant="t", band=BAND,
        kind=RequestKind.CHAT, stream_flag="1", payload=PAYLOAD,
    )  # fmt: skip


@dataclass
class Phase:
    name: str
    depth: int = 0
    enqueue_ms: list[float] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)
    dispatched: int = 0

    def summary(self) -> dict[str, object]:
        return {
            "phase": self.name,
            "queued_jobs": self.depth,
            "enqueue_p50_ms": median(self.enqueue_ms),
            "enqueue_p99_ms": pct(self.enqueue_ms, 99),
            "dispatch_round_p50_ms": median(self.round_ms),
            "dispatch_round_p99_ms": pct(self.round_ms, 99),
            "jobs_per_round": self.dispatched / max(len(self.round_ms), 1),
        }


async def fill(client: Redis, settings: Settings, jobs: int, users: int) -> None:
    """Queue ``jobs`` jobs round-robin over ``users`` users, pipelined (not timed)."""
    queue, scripts = JobQueue(client, settings), Scripts.bind(client)
    for start in range(0, jobs, _FILL_CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + _FILL_CHUNK, jobs)):
                sub = submission(i % users)
                call_keys, args = queue.enqueue_call(sub, fill_id(i), 10**7)
                await scripts.enqueue(keys=call_keys, args=args, client=pipe)
            await pipe.execute()


def fill_id(i: int) -> str:
    """A job id as long as a random one (``new_job_id``), numbered so a sample can be read."""
    return new_job_id(MODEL, f"{i:020x}")


async def run_phase(
    phase: Phase, queue: JobQueue, store: DispatchStore, users: int, rounds: int
) -> None:
    """``rounds`` x (``PICKS`` timed enqueues to random users, one timed dispatch round)."""
    fair = policy("round_robin")
    snap = await store.snapshot(MODEL, PICKS)
    rng = random.Random(7)
    for _ in range(rounds):
        for _ in range(PICKS):
            sub = submission(rng.randrange(users))
            start = time.perf_counter()
            await queue.submit(sub)
            phase.enqueue_ms.append((time.perf_counter() - start) * 1000)
        snap = await store.snapshot(MODEL, PICKS)  # the enqueues' newcomers (not timed)
        start = time.perf_counter()
        top = snap.backlogs[0]
        picks = fair.plan(top.band, top.users, top.join, PICKS)
        ids, snap, _ = await store.dispatch(MODEL, ENDPOINT, 10**9, picks, PICKS)
        phase.round_ms.append((time.perf_counter() - start) * 1000)
        phase.dispatched += len(ids)


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


async def measure(jobs: int, users: int, rounds: int) -> dict[str, object]:
    # No AOF rewrite mid-run: its fork would land in one phase's latencies only.
    with LocalRedis(extra_args=["--auto-aof-rewrite-percentage", "0"]) as server:
        settings = settings_for(server.url)
        client, r = connect(settings), redis.Redis.from_url(server.url)
        try:
            queue, store = JobQueue(client, settings), DispatchStore(client, settings)
            await store.ensure_ready_group(MODEL)
            empty = Phase("almost empty", depth=PICKS)
            await run_phase(empty, queue, store, users, rounds)
            before = used_memory(r)
            started = time.monotonic()
            await fill(client, settings, jobs, users)
            fill_s = time.monotonic() - started
            per_job = (used_memory(r) - before) / jobs
            deep = Phase(f"{jobs:,} queued", depth=jobs)
            await run_phase(deep, queue, store, users, rounds)
            kinds = budget(r, jobs, users)
            info = r.info("server")
        finally:
            await client.aclose()
            r.close()
    return {
        "benchmark": "depth", "machine": machine(), "jobs": jobs, "users": users,
        "rounds": rounds, "picks_per_round": PICKS, "fill_s": fill_s,
        "server": f"valkey {info.get('valkey_version', info['redis_version'])}",
        "phases": [empty.summary(), deep.summary()],
        "memory_per_job_bytes": per_job, "payload_bytes": len(PAYLOAD),
        "memory_per_job_beyond_payload_bytes": per_job - len(PAYLOAD),
        "bytes_per_job_by_key": kinds,
    }  # fmt: skip


def render(result: dict[str, object]) -> str:
    phases = result["phases"]
    assert isinstance(phases, list)
    cols = ("enqueue_p50_ms", "enqueue_p99_ms", "dispatch_round_p50_ms", "dispatch_round_p99_ms")
    rows = [[p["phase"], *(p[c] for c in cols)] for p in phases]
    empty, deep = phases
    rows.append(["ratio (deep / empty)", *(deep[c] / empty[c] for c in cols)])
    latency = markdown_table(
        ["queue", "enqueue p50 ms", "enqueue p99 ms", "round p50 ms", "round p99 ms"], rows
    )
    kinds = result["bytes_per_job_by_key"]
    assert isinstance(kinds, dict)
    memory = markdown_table(["key kind", "bytes per queued job"], list(map(list, kinds.items())))
    m = result["machine"]
    assert isinstance(m, dict)
    return (
        f"{latency}\n\n{memory}\n\nRedis used_memory per queued job: "
        f"{result['memory_per_job_bytes']:.0f} B, of which {result['payload_bytes']} B payload: "
        f"**{result['memory_per_job_beyond_payload_bytes']:.0f} B beyond the payload** "
        f"({result['jobs']:,} jobs over {result['users']:,} users, {result['server']}). "
        f"{result['rounds']} rounds per phase of {result['picks_per_round']} enqueues and one "
        f"dispatch round of {result['picks_per_round']} picks; {m['cores']} cores."
    )


@click.command()
@click.option("--jobs", default=100_000, show_default=True, help="jobs queued in the deep phase")
@click.option("--users", default=10_000, show_default=True, help="users they are spread over")
@click.option("--rounds", default=300, show_default=True, help="timed rounds per phase")
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(jobs: int, users: int, rounds: int, out: str) -> None:
    result = asyncio.run(measure(jobs, users, rounds))
    text = render(result)
    save(out, "depth", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
