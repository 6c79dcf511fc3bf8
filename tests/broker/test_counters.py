"""The counts admission trusts (broker.counters) stay equal to what they count while every
script that writes them runs, interleaved, against the session's real Redis: after each
step the test recounts from the job records and the backlogs and compares."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from redis.asyncio import Redis

from broker import (
    JobQueue,
    JobState,
    Outcome,
    Pick,
    Reclaim,
    Reroute,
    StreamMode,
    Submission,
    keys,
)
from broker import job_fields as jf
from broker.counters import WRITERS
from broker.dispatching import DispatchStore, Grant
from broker.execution import ExecutionStore
from broker.lua import Script
from tests.support.contract import EP, MODEL, settings, submission

TENANT = {"alice": "t1", "bob": "t1", "carol": "t2", "dave": "t2"}


def job(user: str, band: str = "default") -> Submission:
    """Carol's are plain (batch lines): a worker marks them started at hand-over."""
    mode = StreamMode.PLAIN if user == "carol" else StreamMode.STREAMED
    return replace(submission(user, band), tenant=TENANT[user], stream_flag=mode)


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """The names of the scripts the test ran, however they were sent."""
    names: set[str] = set()
    run, queue = Script.run, Script.queue

    async def spied_run(self: Script, *args: Any) -> Any:
        names.add(self.name)
        return await run(self, *args)

    def spied_queue(self: Script, *args: Any) -> None:
        names.add(self.name)
        queue(self, *args)

    monkeypatch.setattr(Script, "run", spied_run)
    monkeypatch.setattr(Script, "queue", spied_queue)
    yield names


async def counted(r: Redis) -> dict[str, dict[str, int]]:
    """Every count as Redis holds it (zeros left out: a count at 0 may stay as a field)."""
    out = {}
    for name, key in (
        ("inflight", keys.inflight(MODEL)),
        ("unstarted", keys.unstarted(MODEL)),
        ("transit", keys.transit(MODEL)),
        ("users", keys.user_counts(MODEL)),
        ("queued", keys.queued_counts(MODEL)),
    ):
        out[name] = {k.decode(): int(v) for k, v in (await r.hgetall(key)).items() if int(v)}
    meta = await r.hgetall(keys.meta(MODEL))
    out["tenants"] = {
        k.decode(): int(v) for k, v in meta.items() if k.startswith(b"tn:") and int(v)
    }
    return out


async def recounted(r: Redis) -> dict[str, dict[str, int]]:
    """What each count counts, from the job records and the backlogs."""
    out: dict[str, Counter[str]] = {name: Counter() for name in WRITERS if name != "credits"}
    backlogged = set()  # (band, user) with a job queued
    async for key in r.scan_iter(match=keys.job_pattern(MODEL)):
        h = await r.hgetall(key)
        state, band, user = (h[f].decode() for f in (jf.STATE, jf.BAND, jf.USER))
        if state == JobState.QUEUED:
            out["queued"][band] += 1
            backlogged.add((band, user))
        if state in (JobState.DISPATCHED, JobState.RUNNING):
            endpoint = h[jf.ENDPOINT].decode()
            out["inflight"][endpoint] += 1
            out["users"][user] += 1
            out["unstarted"][endpoint] += jf.FIRST_OUTPUT not in h
            out["transit"][endpoint] += state == JobState.DISPATCHED
    for band, user in backlogged:
        out["tenants"][keys.tenant_field(band, TENANT[user])] += 1
    return {name: {k: v for k, v in c.items() if v} for name, c in out.items()}


async def hand_back(r: Redis, q: JobQueue, d: DispatchStore, x: ExecutionStore, check: Any) -> None:
    """A job handed back by its worker (its engine never took it), then dispatched again."""
    bobs = await q.submit(job("bob"))
    await d.dispatch(MODEL, EP, 10, [Pick("default", "bob", 3, 0)], 10)
    [handed] = await x.claim(r, [MODEL], "w3", 10, block_ms=100)
    assert await x.start(handed, "w3") == 1
    assert (await x.reroute(handed)).outcome is Reroute.REROUTED
    await check("reroute")
    await d.dispatch(MODEL, EP, 10, [Pick("default", "bob", 4, 0)], 10)
    assert [c.job_id for c in await x.claim(r, [MODEL], "w3", 10, block_ms=100)] == [bobs]
    await check("dispatch of the job handed back")


async def test_every_count_stays_equal_to_what_it_counts_while_all_its_writers_run(
    aredis: Redis, ran: set[str]
) -> None:
    r, s = aredis, settings(lease_ms=100, lease_renew_ms=50)
    q, d, x = JobQueue(r, s), DispatchStore(r, s), ExecutionStore(r, s)
    await x.ensure_groups([MODEL])
    await x.load_scripts()

    async def check(step: str) -> None:
        assert await counted(r) == await recounted(r), f"after {step}"

    async def write(add: Any, *args: Any) -> None:  # the result writer's pipeline
        pipe = x.pipeline()
        add(pipe, *args)
        await pipe.execute()

    async def claim_and_start(*starting: str) -> dict[str, Any]:
        claimed = {c.job_id: c for c in await x.claim(r, [MODEL], "w1", 10, block_ms=100)}
        assert [await x.start(claimed[job_id], "w1") for job_id in starting] == [1] * len(starting)
        return claimed

    users = ["alice"] * 3 + ["bob"] * 2 + ["carol"] * 2
    ids = [await q.submit(job(u, "batch" if u == "carol" else "default")) for u in users]
    await check("enqueue")
    sequence = (await d.snapshot(MODEL, 1)).sequence
    assert await d.grant(MODEL, Grant(EP, {"interactive": 1}), sequence, 60_000)
    dave = await q.submit(job("dave", "interactive"))  # express: nothing queued ahead of it
    await check("enqueue, express")
    picks = [Pick("default", "alice", 1, 0), Pick("default", "bob", 1, 0)]
    picks += [Pick("batch", "carol", 1, 0)] * 2  # her queue empties: she leaves the backlog
    await d.dispatch(MODEL, EP, 10, picks, 10)
    await check("dispatch")
    claimed = await claim_and_start(ids[0], ids[5], dave)  # bob's ids[3] stays dispatched
    await check("start")
    await write(x.add_first, MODEL, dave)
    await check("first")
    assert await d.park(MODEL, EP, min_jobs=2) == (ids[6], "carol")  # she has two there
    await check("park")
    # Queued (bob's last: he leaves the backlog), dispatched, running after its first output.
    for job_id, owner in ((ids[4], "bob"), (ids[3], "bob"), (dave, "dave")):
        await q.cancel(job_id, owner)
        await check(f"cancel of {owner}'s {job_id}")
    await write(x.add_complete, claimed[ids[5]], Outcome(JobState.COMPLETED))
    await check("complete")
    await d.dispatch(MODEL, EP, 10, [Pick("batch", "carol", 2, 0)], 10)
    await check("dispatch of the parked job")
    await claim_and_start(ids[6])
    await write(x.add_first, MODEL, ids[6])  # plain: marked at hand-over, no output yet
    await check("start, first")
    await asyncio.sleep(0.2)  # w1 died: its leases lapse
    taken = await x.reclaim(MODEL, "w2", 10)
    assert sorted((t.job.job_id, t.decision) for t in taken) == sorted(
        (job_id, Reclaim.RETRY) for job_id in (ids[0], ids[6])
    )
    await check("reclaim")
    for t in taken:
        await write(x.add_complete, t.job, Outcome(JobState.FAILED))
    await check("complete after reclaim")
    await q.submit(job("carol", "batch"))
    assert await x.expire(MODEL, "batch", 0)
    await check("expire")
    await hand_back(r, q, d, x, check)
    assert set().union(*WRITERS.values()) <= ran  # every writer of every count ran


async def test_express_credits_are_the_grant_less_the_sends_made_under_it(aredis: Redis) -> None:
    r, s = aredis, settings()
    q, d = JobQueue(r, s), DispatchStore(r, s)
    sequence = (await d.snapshot(MODEL, 1)).sequence
    grant = Grant(EP, {"interactive": 2, "default": 2}, served=1)
    assert await d.grant(MODEL, grant, sequence, 60_000)
    for user in ("alice", "bob", "carol"):  # the third finds no credit left: queued
        await q.submit(job(user, "interactive"))
    fields = [keys.grant_field("interactive"), keys.grant_field("default"), "xsv"]
    assert [int(v) for v in await r.hmget(keys.meta(MODEL), fields)] == [0, 0, 0]
    assert await r.hlen(keys.queued_counts(MODEL)) == 1
