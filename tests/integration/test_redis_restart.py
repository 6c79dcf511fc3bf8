"""A Redis restart under load: every component reconnects and carries on.

Real processes (gateway, dispatcher, worker, simulator) against a private Redis
with the append-only file fsynced every second (the persistence fairq expects,
docs/operations.md). Clients stream requests while the server is restarted on
the same port over the same files:

* cleanly (SIGTERM: Redis fsyncs and exits): every job acknowledged (its
  response headers carried a job id) reaches a terminal state;
* with SIGKILL: every job acknowledged more than the fsync window (1 s, plus a
  margin for a busy box) before the kill reaches a terminal state; a younger one
  may be lost, but whatever Redis still knows of must end too.

Requests sent while Redis is down get a clear 503 OpenAI error, never a 500 or a
hang; and new jobs after the restart complete.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
from redis.asyncio import Redis

from broker import Claimed, ExecutionStore, JobState, Outcome, RequestKind, keys
from broker.jobs import new_job_id
from fairq.stack.localredis import LocalRedis
from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support.eventually import eventually
from tests.support.settings import api_key, make_settings
from tests.support.stack import demo_stack, gateway

pytestmark = pytest.mark.integration

AUTH = {"Authorization": "Bearer fq-demo-alice"}
TERMINAL = {"completed", "failed", "cancelled", "expired"}
FSYNC_WINDOW_S = 1.0
MARGIN_S = 1.0  # the box is shared: an fsync may come late
STREAM_DEADLINE_S = 12.0  # a stream of 12 tokens that has not ended by then hangs


@dataclass
class Sent:
    """One request of the load: when Redis acknowledged it, and how it ended for the client."""

    job_id: str | None = None
    acked_at: float | None = None  # monotonic, when the response headers arrived
    status: int | None = None
    outcome: str = "pending"  # done | error-event | http-<status> | transport-error


@dataclass
class Load:
    """Client threads that stream small requests until told to stop."""

    url: str
    threads: int = 6
    sent: list[Sent] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for i in range(self.threads):
            thread = threading.Thread(target=self._run, args=(i,), daemon=True)
            thread.start()
            self._pool.append(thread)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        for thread in self._pool:
            thread.join(timeout_s)
        hung = [s for s in self.sent if s.outcome == "pending"]
        assert not any(t.is_alive() for t in self._pool), f"clients hung: {hung}"

    def _run(self, i: int) -> None:
        with httpx.Client(timeout=httpx.Timeout(20.0, connect=5.0)) as client:
            while not self._stop.is_set():
                sent = Sent()
                with self._lock:
                    self.sent.append(sent)
                _stream_one(client, self.url, DEMO_MODELS[i % 2], sent)


def _stream_one(client: httpx.Client, url: str, model: str, sent: Sent) -> None:
    body = {"model": model, "stream": True, "max_tokens": 12,
            "messages": [{"role": "user", "content": "count"}]}  # fmt: skip
    try:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body,
                           headers=AUTH) as response:  # fmt: skip
            sent.status = response.status_code
            if response.status_code != 200:
                response.read()
                sent.outcome = f"http-{response.status_code}"
                assert response.json()["error"]["code"], response.text
                return
            sent.job_id = response.headers["x-fairq-job-id"]
            sent.acked_at = time.monotonic()
            text = ""
            for part in response.iter_text():  # a keep-alive comes every 15 s at least
                text += part
                if time.monotonic() - sent.acked_at > STREAM_DEADLINE_S:
                    sent.outcome = "hung"
                    return
        sent.outcome = "error-event" if '"error"' in text else "done"
        assert text.endswith("data: [DONE]\n\n"), text[-200:]
    except httpx.TransportError:
        sent.outcome = "transport-error"


@pytest.fixture
def redis_server() -> Iterator[LocalRedis]:
    with LocalRedis() as server:
        yield server


@pytest.fixture
def stack(redis_server: LocalRedis) -> Iterator[Stack]:
    # The default worker lease (15 s) outlasts these outages: a worker's jobs stay its own.
    with demo_stack(redis_url=redis_server.url) as running:
        yield running


@pytest.fixture
def quick_reclaim_stack(redis_server: LocalRedis) -> Iterator[Stack]:
    """A short worker lease: a job the lost second left "running" is reclaimed in seconds.
    (An outage longer than the lease would make live workers' jobs look abandoned.)"""
    leases = {"lease_ms": 2000, "lease_renew_ms": 400}
    with demo_stack(redis_url=redis_server.url, overrides=leases) as running:
        yield running


def _states(url: str, job_ids: list[str], timeout_s: float) -> dict[str, str]:
    """Each job's state, polled until all are terminal or lost (404), or ``timeout_s``
    passed. A lost job never ends: waiting on it would always take ``timeout_s``. Jobs
    still not ended then are for the test to judge."""
    states: dict[str, str] = {}
    with httpx.Client(timeout=5.0) as client:

        def not_ended() -> list[str]:
            for job_id in [j for j in job_ids if states.get(j) not in TERMINAL]:
                response = client.get(f"{url}/v1/jobs/{job_id}", headers=AUTH)
                states[job_id] = (
                    response.json()["status"] if response.status_code == 200 else "lost"
                )
            return [j for j in job_ids if states[j] not in TERMINAL | {"lost"}]

        with contextlib.suppress(AssertionError):
            eventually(
                not_ended,
                "every job to end",
                timeout_s,
                until=lambda left: not left,
                interval_s=0.2,
            )
    return states


def _down_requests(url: str) -> list[int]:
    """Requests made while Redis is down: each must answer, and with 503."""
    body = {
        "model": DEMO_MODELS[0],
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "x"}],
    }
    statuses = []
    with httpx.Client(timeout=15.0) as client:
        for method, path, payload in (
            ("POST", "/v1/chat/completions", body),
            ("GET", f"/v1/jobs/{new_job_id(DEMO_MODELS[0])}", None),
            ("GET", "/readyz", None),
        ):
            response = client.request(method, f"{url}{path}", json=payload, headers=AUTH)
            statuses.append(response.status_code)
            assert response.json()["error"]["code"] == "redis_unavailable", response.text
    return statuses


def _restart_under_load(
    stack: Stack, server: LocalRedis, *, kill: bool, before_s: float, down_s: float = 0.0
) -> tuple[Load, float]:
    load = Load(stack.gateway_url)
    load.start()
    time.sleep(before_s)
    restarted_at = time.monotonic()
    server.halt(kill=kill)
    assert _down_requests(stack.gateway_url) == [503, 503, 503]
    time.sleep(down_s)
    server.start()
    time.sleep(2.0)
    load.stop()
    return load, restarted_at


def _report(label: str, load: Load, states: dict[str, str]) -> None:
    print(f"\n{label}: {len(load.sent)} requests; client outcomes",
          dict(Counter(s.outcome for s in load.sent)), "job states",
          dict(Counter(states.values())))  # fmt: skip


def _after_restart_jobs_complete(stack: Stack) -> None:
    body = {"model": DEMO_MODELS[1], "prompt": "x", "max_tokens": 3}
    with httpx.Client(timeout=20.0) as client:
        for _ in range(5):
            response = client.post(f"{stack.gateway_url}/v1/completions", json=body, headers=AUTH)
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] == 3


def test_a_clean_redis_restart_under_load_loses_no_acknowledged_job(
    stack: Stack, redis_server: LocalRedis
) -> None:
    # Down for longer than a dispatcher's lease (3 s): the leases lapse and are taken again.
    load, _ = _restart_under_load(stack, redis_server, kill=False, before_s=2.0, down_s=3.5)
    acked = [s.job_id for s in load.sent if s.job_id is not None]
    states = _states(stack.gateway_url, acked, timeout_s=20.0)
    _report("SIGTERM", load, states)
    assert len(acked) > 20  # the load really ran on both sides of the restart
    assert {j: s for j, s in states.items() if s not in TERMINAL} == {}
    # Nothing was lost and nothing failed: a clean restart is invisible to a finished job.
    assert Counter(states.values()) == {"completed": len(acked)}
    assert all(s.outcome in {"done", "http-503", "transport-error"} for s in load.sent)
    _after_restart_jobs_complete(stack)
    assert stack.dead() is None
    with redis.Redis.from_url(redis_server.url) as client:
        assert all(client.exists(keys.owner(m)) for m in DEMO_MODELS)  # owned again


def test_a_killed_redis_loses_no_acknowledged_job(stack: Stack, redis_server: LocalRedis) -> None:
    # Redis writes the AOF before it replies; only the fsync is once a second. A killed
    # process therefore loses nothing it acknowledged (the kernel still has the file).
    load, _ = _restart_under_load(stack, redis_server, kill=True, before_s=2.0)
    acked = [s.job_id for s in load.sent if s.job_id is not None]
    states = _states(stack.gateway_url, acked, timeout_s=20.0)
    _report("SIGKILL", load, states)
    assert len(acked) > 20
    assert Counter(states.values()) == {"completed": len(acked)}
    _after_restart_jobs_complete(stack)
    assert stack.dead() is None


def _crash_losing_the_tail(server: LocalRedis, tmp_path: Path) -> float:
    """A power loss: Redis comes back with its files as they were a fsync window ago.

    The copy of the AOF is taken while Redis writes, so its last command may be cut
    short, as after a real crash (Redis loads a truncated AOF up to its last whole command).
    """
    assert server.data_dir is not None
    snapshot = tmp_path / "aof"
    shutil.copytree(server.data_dir, snapshot)
    copied_at = time.monotonic()
    time.sleep(FSYNC_WINDOW_S)
    server.halt(kill=True)
    shutil.rmtree(server.data_dir)
    shutil.copytree(snapshot, server.data_dir)
    server.start()
    return copied_at


def test_a_machine_crash_loses_at_most_the_fsync_window(
    quick_reclaim_stack: Stack, redis_server: LocalRedis, tmp_path: Path
) -> None:
    stack = quick_reclaim_stack
    load = Load(stack.gateway_url)
    load.start()
    time.sleep(3.0)
    copied_at = _crash_losing_the_tail(redis_server, tmp_path)
    time.sleep(2.0)
    load.stop()
    acked = [s for s in load.sent if s.job_id is not None]
    states = _states(stack.gateway_url, [s.job_id for s in acked], timeout_s=20.0)  # type: ignore[misc]
    _report("power loss", load, states)
    old = [s for s in acked if s.acked_at is not None and s.acked_at < copied_at - MARGIN_S]
    assert len(old) > 10
    assert {s.job_id: states[s.job_id] for s in old if states[s.job_id] == "lost"} == {}
    # A job lost with the window ends a client still waiting with an error: no hang.
    lost = [s for s in acked if states[s.job_id] == "lost"]  # type: ignore[index]
    assert lost, "the crash lost nothing: the test did not test the window"
    assert {s.job_id: s.outcome for s in lost if s.outcome not in {"done", "error-event"}} == {}
    _after_restart_jobs_complete(stack)
    assert stack.dead() is None
    stuck = {j: s for j, s in states.items() if s not in TERMINAL | {"lost"}}
    stuck |= {s.job_id: f"client {s.outcome}" for s in acked if s.outcome == "hung"}
    # A job that ended in the lost second is back to "running" in Redis while its worker
    # has moved on: the reclaim of the lapsed lease ends it (within lease_ms, 2 s here).
    assert stuck == {}


async def test_a_workers_writes_for_a_job_redis_lost_leave_nothing_forever(
    aredis: Redis, redis_url: str
) -> None:
    # After a power loss a worker may still finish a job Redis no longer knows.
    settings = make_settings(redis_url, ["http://e:1"], model="m")
    store = ExecutionStore(aredis, settings)
    await store.load_scripts()
    job = Claimed(
        "m", b"1-0", "bQ.lost", b"{}", RequestKind.CHAT, "1", "http://e:1", "default", "u"
    )
    pipe = store.pipeline()
    store.add_chunk(pipe, "m", job.job_id, b"0-1", b"data: {}\n\n")
    store.add_first(pipe, "m", job.job_id)
    store.add_complete(pipe, job, Outcome(JobState.COMPLETED))
    replies = await pipe.execute()
    assert replies[1:] == [0, 0]  # neither started nor ended anything
    assert not await aredis.exists(keys.job("m", job.job_id))
    assert 0 < await aredis.ttl(keys.results("m", job.job_id)) <= settings.result_ttl_s


@pytest.mark.timeout(30)  # without the restart watch, the stream would wait forever
def test_a_client_waiting_on_a_job_redis_lost_gets_an_error_not_a_hang(
    redis_server: LocalRedis,
) -> None:
    settings = make_settings(
        redis_server.url, ["http://e:1"], model="m", api_keys=[api_key("k", "u")]
    )
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    # Early headers: the 200 while the job is queued. Held ones would leave only at the
    # first lull (15 s), as long as the client's read timeout.
    headers = {"Authorization": "Bearer k", "X-Fairq-Stream-Headers": "early"}
    with gateway(settings) as url, httpx.Client(timeout=15) as client:
        stream = client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers)
        with stream as response:
            assert response.status_code == 200  # queued; nobody serves model m here
            # Redis comes back with none of its files: everything was lost.
            redis_server.halt(kill=True)
            assert redis_server.data_dir is not None
            shutil.rmtree(redis_server.data_dir)
            redis_server.data_dir.mkdir()
            redis_server.start()
            text = "".join(response.iter_text())
    assert '"code":"job_lost"' in text and text.endswith("data: [DONE]\n\n")


@pytest.mark.timeout(60)
def test_a_redis_that_stops_answering_gets_requests_a_503_in_bounded_time_not_a_hang() -> None:
    """SIGSTOP: the kernel still takes the connections, nothing answers. Every request
    off the streaming path (each a redis-py command: a job's status, the dead letters,
    readiness) ends with a 503 within ``redis_command_timeout_s``; once Redis runs
    again, the same requests are answered."""
    with LocalRedis() as server:
        settings = make_settings(
            server.url,
            ["http://e:1"],
            model="m",
            api_keys=[api_key("k", "u", admin=True)],
            redis_command_timeout_s=0.5,
        )
        paths = [f"/v1/jobs/{new_job_id('m')}", "/v1/admin/dead-letters?model=m", "/readyz"]
        headers = {"Authorization": "Bearer k"}
        with gateway(settings) as url, httpx.Client(timeout=20) as client:
            assert [client.get(url + p, headers=headers).status_code for p in paths] == [
                404, 200, 200
            ]  # fmt: skip
            assert server.process is not None
            server.process.send_signal(signal.SIGSTOP)
            try:
                for path in paths:  # a hang would end in the client's time-out (20 s)
                    response = client.get(url + path, headers=headers)
                    assert response.status_code == 503, response.text
                    assert response.json()["error"]["code"] == "redis_unavailable"
            finally:
                server.process.send_signal(signal.SIGCONT)
            assert [client.get(url + p, headers=headers).status_code for p in paths] == [
                404, 200, 200
            ]  # fmt: skip
