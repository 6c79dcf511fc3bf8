"""Resuming a stream: SSE event ids and ``GET /v1/jobs/{id}/stream`` with ``Last-Event-ID``.

A client whose connection is cut (or whose gateway is SIGKILLed) reconnects with
the id of the last event it received and gets exactly the rest: the events it
saw plus the ones it is sent again equal the job's whole stream, in order,
nothing twice. Real Redis, the simulator and gateways under uvicorn (or as a
``fairq api`` subprocess), the dispatcher and a worker in the test's loop.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from redis.asyncio import Redis

from broker import AsyncClient, keys
from fairq.stack.localredis import free_port
from sim import SimProfile
from tests.support.eventually import WAIT_S, aeventually
from tests.support.settings import ALICE, ALICE_KEY, BOB, MODEL, make_config, make_settings
from tests.support.stack import (
    WorkerProcesses,
    chat,
    components,
    job_field,
    metric,
    sim,
    state_is,
)
from tests.support.stack import gateway as gateway_server

pytestmark = pytest.mark.integration

SLOW = SimProfile(step_base_ms=8.0, step_per_seq_ms=0.05)  # ~120 tokens/s: time to cut
Event = tuple[str, str]  # (id, data)


@pytest.fixture
def engine() -> Iterator[str]:
    with sim(SLOW) as url:
        yield url


async def read_events(response: httpx.Response, limit: int | None = None) -> list[Event]:
    """Complete SSE events (id, data) in order; stops after ``limit`` data events."""
    events: list[Event] = []
    event_id, data = "", ""
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data = line[6:]
        elif not line and data:
            events.append((event_id, data))
            event_id, data = "", ""
            if limit is not None and len(events) >= limit:
                break
    return events


async def resume(http: httpx.AsyncClient, job_id: str, last: str | None) -> list[Event]:
    headers = {**ALICE, **({"Last-Event-ID": last} if last else {})}
    async with http.stream("GET", f"/v1/jobs/{job_id}/stream", headers=headers) as response:
        assert response.status_code == 200
        return await read_events(response)


async def test_a_client_cut_mid_stream_resumes_without_gaps_or_duplicates(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True)
    with gateway_server(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http, components(settings):
            body = chat(stream=True, max_tokens=80)
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=ALICE) as r:
                job_id = r.headers["x-fairq-job-id"]
                seen = await read_events(r, limit=10)  # then the connection is cut
            rest = await resume(http, job_id, seen[-1][0])
            whole = await resume(http, job_id, None)  # the job has ended: all of it again
    assert [e for e in seen + rest] == whole
    ids = [event_id for event_id, _ in whole]
    assert len(set(ids)) == len(ids) and all(ids)  # every event has its own id
    assert whole[-1][1] == "[DONE]" and len(whole) == 1 + 80 + 1  # role, tokens, [DONE]
    assert await job_field(aredis, job_id, "st") == "completed"  # resumed in time: kept


async def test_a_resume_in_the_middle_of_an_entry_skips_exactly_the_events_seen(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True)
    async with AsyncClient(settings, api_key=ALICE_KEY) as client:
        job_id = await client.submit(MODEL, messages=[{"role": "user", "content": "x"}],
                                     stream=True)  # fmt: skip
    # Results as a worker writes them: several events per entry, then the end.
    out = keys.results(MODEL, job_id)
    await aredis.xadd(out, {"d": b"data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: {\"n\":3}\n\n"},
                      id="0-1")  # fmt: skip
    await aredis.xadd(out, {"d": b'data: {"n":4}\n\ndata: {"n":5}\n\n'}, id="0-2")
    await aredis.xadd(out, {"end": "completed", "e": ""})
    await aredis.hset(keys.job(MODEL, job_id), "st", "completed")
    with gateway_server(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
            rest = await resume(http, job_id, "0-1.1")
            bad = await http.get(f"/v1/jobs/{job_id}/stream",
                                 headers={**ALICE, "Last-Event-ID": "yesterday"})  # fmt: skip
            other = await http.get(f"/v1/jobs/{job_id}/stream", headers=BOB)
    assert [data for _, data in rest] == ['{"n":3}', '{"n":4}', '{"n":5}', "[DONE]"]
    assert [i for i, _ in rest][:3] == ["0-1.2", "0-2.0", "0-2.1"]
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert other.status_code == 404


async def test_a_client_that_leaves_and_does_not_come_back_is_cancelled_after_the_grace(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True, stream_resume_grace_s=0.3)
    before = metric(engine, "vllm:request_success_total", finished_reason="abort")
    with gateway_server(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http, components(settings):
            body = chat(stream=True, max_tokens=2000)
            async with http.stream("POST", "/v1/chat/completions", json=body, headers=ALICE) as r:
                job_id = r.headers["x-fairq-job-id"]
                await read_events(r, limit=3)
            await aeventually(lambda: state_is(aredis, job_id, "cancelled"), "the cancel")
            await aeventually(
                lambda: (
                    metric(engine, "vllm:request_success_total", finished_reason="abort") > before
                ),
                "the engine to abort the request",
            )


async def test_a_stream_survives_its_gateway_being_killed_and_resumes_on_another(
    redis_url: str, engine: str, aredis: Redis
) -> None:
    settings = make_settings(redis_url, [engine], quick=True)
    procs = WorkerProcesses(make_config([engine], quick=True), redis_url)
    port = free_port()
    try:
        procs.spawn_gateway(port)
        first = procs.procs[-1]
        async with components(settings):
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         timeout=WAIT_S) as http:  # fmt: skip
                body = chat(stream=True, max_tokens=80)
                async with http.stream(
                    "POST", "/v1/chat/completions", json=body, headers=ALICE
                ) as r:
                    job_id = r.headers["x-fairq-job-id"]
                    seen = await read_events(r, limit=10)
                    first.kill()  # SIGKILL: the gateway dies with the stream open
                    first.wait(10)
            with gateway_server(settings) as url:
                async with httpx.AsyncClient(base_url=url, timeout=WAIT_S) as http:
                    rest = await resume(http, job_id, seen[-1][0])
                    whole = await resume(http, job_id, None)
    finally:
        procs.close()
    assert seen + rest == whole and whole[-1][1] == "[DONE]" and len(whole) == 82
    assert await job_field(aredis, job_id, "st") == "completed"
