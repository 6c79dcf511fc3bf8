"""Every component's ``/metrics`` and ``fairq status --json`` against the real local stack.

The stack runs as real processes (its own Redis, two simulated engines, a dispatcher,
a worker, the gateway). ``demo-code`` is admitted by a static in-flight cap of 1, so
a burst of requests from two users builds a backlog there for certain; ``demo-chat``
is admitted by the engine's metrics and serves streamed requests (time to first
token). While the backlog stands the test reads the queue series and the status;
after the load it reads the counters and histograms of what happened.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

ALICE = {"Authorization": "Bearer fq-demo-alice"}
BOB = {"Authorization": "Bearer fq-demo-bob"}
_WAIT_S = 60.0
_POLL = {"timeout_s": _WAIT_S, "interval_s": 0.1}  # each check scrapes or runs a process

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    text = local_http.get(url, timeout=5.0).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of the samples named ``name`` whose labels include ``labels``; None if none."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    return sum(found) if found else None


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    backlog = {"demo-code": {"admission": "static", "inflight_cap": 1}}  # a backlog for certain
    with demo_stack(per_model=backlog) as running:
        yield running


def _post(
    stack: Stack, headers: dict[str, str], model: str, stream: bool, answers: list[str]
) -> None:
    """One request; its status and the start of its body go into ``answers``."""
    body = {"model": model, "stream": stream, "max_tokens": 60,
            "messages": [{"role": "user", "content": "Hello"}]}  # fmt: skip
    try:
        with httpx.Client(timeout=_WAIT_S) as client:
            r = client.post(f"{stack.gateway_url}/v1/chat/completions", headers=headers, json=body)
            answers.append(f"{r.status_code} {r.text[:200]}")
    except httpx.HTTPError as exc:
        answers.append(f"{type(exc).__name__}: {exc}")


def _load(stack: Stack, answers: list[str]) -> list[threading.Thread]:
    requests = [(ALICE, "demo-code", False)] * 8 + [(BOB, "demo-code", False)] * 3
    requests += [(ALICE, "demo-chat", True)] * 4
    threads = [threading.Thread(target=_post, args=(stack, *r, answers)) for r in requests]
    for thread in threads:
        thread.start()
    return threads


def _all_answered(threads: list[threading.Thread], answers: list[str]) -> None:
    """Every request of ``_load`` ended, and with a 200: the counts asserted on need all 15."""
    for thread in threads:
        thread.join(_WAIT_S)
    assert len(answers) == 15 and all(a.startswith("200 ") for a in answers), answers


def _status(stack: Stack) -> dict[str, object]:
    run = subprocess.run(
        [sys.executable, "-m", "fairq", "status", "--json"],
        env=stack.env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    body: dict[str, object] = json.loads(run.stdout)
    return body


def _by_model(status: dict[str, object]) -> dict[str, dict[str, object]]:
    return {m["model"]: m for m in status["models"]}  # type: ignore[attr-defined, index]


def _engines_healthy(dispatcher: str) -> bool:
    s = scrape(dispatcher)
    return all(value(s, "fairq_engine_healthy", model=m) == 1 for m in DEMO_MODELS)


def _cancel_a_job(stack: Stack) -> None:
    """Cancel a job queued (or running: it is long enough never to finish first)."""
    body = {"model": "demo-code", "stream": True, "max_tokens": 4000,
            "messages": [{"role": "user", "content": "cancel me"}]}  # fmt: skip
    url = f"{stack.gateway_url}/v1/chat/completions"
    with (
        httpx.Client(timeout=10.0) as client,
        client.stream("POST", url, headers=BOB, json=body) as r,
    ):
        job_id = r.headers["X-Fairq-Job-Id"]
        cancelled = client.delete(f"{stack.gateway_url}/v1/jobs/{job_id}", headers=BOB)
        assert cancelled.json()["status"] == "cancelled"


def test_each_component_exports_its_series_and_status_shows_the_backlog(stack: Stack) -> None:
    dispatcher = stack.metrics_url("dispatcher-0")
    answers: list[str] = []
    threads = _load(stack, answers)

    def backlog_of_alice() -> bool:
        s = scrape(dispatcher)
        depth = value(s, "fairq_queue_depth", model="demo-code", band="interactive")
        top = value(s, "fairq_queue_user_depth", model="demo-code", user="alice")
        return bool(depth and top)

    eventually(backlog_of_alice, "demo-code's backlog and alice among its top users", **_POLL)
    s = scrape(dispatcher)
    assert value(s, "fairq_queue_backlogged_users", model="demo-code", band="interactive")
    assert value(s, "fairq_admission_refusals_total", model="demo-code", reason="inflight_cap")
    status = _by_model(_status(stack))
    code = status["demo-code"]
    assert code["source"] == "dispatcher"
    interactive = next(b for b in code["bands"] if b["band"] == "interactive")  # type: ignore[attr-defined]
    assert interactive["queued"] > 0
    assert "alice" in {u["user"] for u in interactive["top_users"]}
    _cancel_a_job(stack)
    _all_answered(threads, answers)

    worker = stack.metrics_url("worker-0")

    def all_timed() -> bool:
        w = scrape(worker)
        return value(w, "fairq_queue_wait_seconds_count", model="demo-code") == 11 and (
            value(w, "fairq_ttft_seconds_count", model="demo-chat") == 4
        )

    eventually(all_timed, "queue wait of 11 demo-code jobs and TTFT of 4 demo-chat jobs", **_POLL)
    w = scrape(worker)
    assert value(w, "fairq_jobs_ended_total", model="demo-code", state="completed") == 11
    assert value(w, "fairq_jobs_ended_total", model="demo-chat", state="completed") == 4
    assert value(w, "fairq_worker_jobs_running", model="demo-chat") == 0
    assert value(w, "fairq_worker_concurrency") == 64
    # Not streamed to their clients, but streamed from the engine: first tokens seen.
    assert value(w, "fairq_ttft_seconds_count", model="demo-code") == 11

    # A scrape that timed out on this busy box makes an engine unhealthy until the next.
    eventually(lambda: _engines_healthy(dispatcher), "both engines healthy", **_POLL)
    s = scrape(dispatcher)
    assert value(s, "fairq_dispatched_total", model="demo-code", band="interactive")
    for model in DEMO_MODELS:
        assert value(s, "fairq_engine_inflight", model=model) is not None
        assert value(s, "fairq_queue_depth", model=model, band="batch") == 0
    assert value(s, "fairq_engine_waiting", model="demo-chat") is not None  # scraped
    assert value(s, "fairq_engine_kv_cache_usage", model="demo-chat") is not None
    assert value(s, "fairq_engine_waiting", model="demo-code") is None  # static: not scraped

    g = scrape(f"{stack.gateway_url}/metrics")
    submitted = value(g, "fairq_jobs_submitted_total", model="demo-code")
    assert submitted == 12  # 11 + the cancelled one, queued or sent express
    assert value(g, "fairq_jobs_ended_total", model="demo-code", state="cancelled") == 1

    def chat_history_has_ttft() -> bool:
        chat = _by_model(_status(stack))["demo-chat"]
        return any(point[2] is not None for point in chat["history"])  # type: ignore[attr-defined]

    eventually(chat_history_has_ttft, "a TTFT point in demo-chat's status history", **_POLL)
    final = _by_model(_status(stack))
    assert set(final) == set(DEMO_MODELS)
    for model in final.values():
        (endpoint,) = model["endpoints"]  # type: ignore[misc]
        assert endpoint["healthy"] is True
        assert set(endpoint["admission"]) == {"interactive", "default", "batch"}
    assert final["demo-chat"]["endpoints"][0]["kv_usage"] is not None  # type: ignore[index]


def test_status_without_a_dispatcher_reads_the_queues_and_says_engines_are_unknown(
    stack: Stack,
) -> None:
    env = {**stack.env, "FAIRQ_REDIS_URL": stack.redis_url or "", "FAIRQ_LOG_LEVEL": "WARNING"}
    # Another Redis database of the same server: no dispatcher has published there.
    env["FAIRQ_REDIS_URL"] = env["FAIRQ_REDIS_URL"].rsplit("/", 1)[0] + "/5"
    run = subprocess.run(
        [sys.executable, "-m", "fairq", "status"], env=env, capture_output=True, text=True,
        timeout=30, check=True,
    )  # fmt: skip
    assert "no dispatcher status" in run.stdout
    for model in DEMO_MODELS:
        assert model in run.stdout
