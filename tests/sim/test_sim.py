"""The engine simulator against real vLLM 0.32 captures, through a real uvicorn server.

The HTTP tests talk to a live server (a uvicorn thread, or a `serve()`
subprocess for signal handling); nothing is mocked. Wire shapes are compared
with the captures in tests/fixtures/vllm-0.32-cpu (copied from shared/fixtures).
The scheduler tests drive the pure scheduler step by step on hand-made states,
with no clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairq.stack.localredis import free_port
from sim import ProfileError, SimProfile, load_profile
from sim._scheduler import SchedSeq, Scheduler, SeqStatus, StepPlan, step_duration_s
from tests.support.eventually import aeventually
from tests.support.paths import REPO
from tests.support.stack import sim, wait_healthy

FIXTURES = REPO / "tests" / "fixtures" / "vllm-0.32-cpu"
MODEL = "tiny"
FAST = SimProfile(step_base_ms=1.0, step_per_seq_ms=0.05, default_output_tokens=5)
DEADLINE_S = 5.0
EMITTED_METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:num_preemptions": "counter",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
}


# --- helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with sim(FAST, [MODEL]) as url:
        yield url


def shape(value: Any) -> Any:
    """Keys in order, nested, with leaf types: what must match vLLM byte for byte."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


def lists_as_one(value: Any) -> Any:
    """``shape`` with each list as its distinct items' shapes (token id lists of any length)."""
    if isinstance(value, dict):
        return [(key, lists_as_one(item)) for key, item in value.items()]
    if isinstance(value, list):
        return list(dict.fromkeys(repr(lists_as_one(item)) for item in value))
    return type(value).__name__


def chunk_kind(chunk: dict[str, Any]) -> str:
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    if choice.get("delta", {}).get("role") == "assistant":
        return "role"
    return "token" if choice["finish_reason"] is None else "final"


def fixture_events(name: str) -> list[bytes]:
    text = (FIXTURES / name).read_bytes().replace(b"\r\n", b"\n")
    _, body = text.split(b"\n\n", 1)
    return [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]


def shapes_by_kind(events: list[bytes]) -> tuple[list[str], dict[str, Any]]:
    chunks = [orjson.loads(event) for event in events if event != b"[DONE]"]
    kinds = [chunk_kind(chunk) for chunk in chunks]
    return kinds, {chunk_kind(chunk): shape(chunk) for chunk in chunks}


async def stream_events(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[bytes]:
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        return [line[6:].encode() async for line in response.aiter_lines() if line[:6] == "data: "]


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], **extra}


def completion_body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Hello there", **extra}


def metric_value(text: str, sample_name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == sample_name and labels.items() <= sample.labels.items():
                return float(sample.value)
    raise AssertionError(f"no sample {sample_name} {labels}")


async def scrape(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


async def wait_for_metrics(client: httpx.AsyncClient, **expected: float) -> None:
    """Poll /metrics until every `vllm:<name>` sample has the expected value."""

    async def seen() -> dict[str, float]:
        text = await scrape(client)
        return {name: _sample(text, name) for name in expected}

    what = f"metrics {expected}"
    await aeventually(seen, what, DEADLINE_S, until=lambda s: s == expected, interval_s=0.01)


def _sample(text: str, name: str) -> float:
    if name == "aborts":
        return metric_value(text, "vllm:request_success_total", finished_reason="abort")
    return metric_value(text, f"vllm:{name}", model_name=MODEL)


@contextlib.asynccontextmanager
async def client_for(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
        yield client


# --- wire shapes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "fixture"),
    [
        ("/v1/chat/completions", chat_body, "sse_sample_with_headers_chat.txt"),
        ("/v1/completions", completion_body, "sse_sample_with_headers_completions.txt"),
    ],
)
async def test_streamed_chunks_have_the_key_structure_of_the_vllm_capture(
    base_url: str, path: str, body: Any, fixture: str
) -> None:
    want_kinds, want_shapes = shapes_by_kind(fixture_events(fixture))
    async with client_for(base_url) as client:
        events = await stream_events(
            client, path, body(max_tokens=4, stream=True, stream_options={"include_usage": True})
        )
    kinds, shapes = shapes_by_kind(events)
    assert kinds == want_kinds
    assert shapes == want_shapes
    assert events[-1] == b"[DONE]"


@pytest.mark.parametrize(
    ("path", "body", "fixture"),
    [
        ("/v1/chat/completions", chat_body, "sse_sample_token_ids_chat.txt"),
        ("/v1/completions", completion_body, "sse_sample_token_ids_completions.txt"),
        ("/v1/completions", lambda **x: {"model": MODEL, "prompt": [321, 286, 13], **x},
         "sse_sample_token_ids_prompt_ids.txt"),
    ],
)  # fmt: skip
async def test_with_return_token_ids_every_chunk_has_the_shape_of_the_vllm_capture(
    base_url: str, path: str, body: Any, fixture: str
) -> None:
    # The prompt's ids in the first chunk (chat: at its top; completion: in its choice),
    # each token's id in its own chunk: the chunk shapes in order, not only by kind.
    want = [lists_as_one(orjson.loads(e)) for e in fixture_events(fixture) if e != b"[DONE]"]
    request = body(max_tokens=4, stream=True, stream_options={"include_usage": True},
                   return_token_ids=True)  # fmt: skip
    async with client_for(base_url) as client:
        events = await stream_events(client, path, request)
    assert [lists_as_one(orjson.loads(e)) for e in events if e != b"[DONE]"] == want


async def test_a_prompt_of_an_answers_ids_gets_the_rest_of_that_answer(base_url: str) -> None:
    # As greedy decoding on a real engine: the simulator's tokens follow from the prompt's
    # ids and their positions (sim/_tokens.py), which fairq's exact resume needs.
    request = chat_body(max_tokens=6, stream=True, return_token_ids=True, request_id="r1")
    async with client_for(base_url) as client:
        first = [
            orjson.loads(e)
            for e in await stream_events(client, "/v1/chat/completions", request)
            if e != b"[DONE]"
        ]
        ids = [i for c in first[1:] for i in c["choices"][0]["token_ids"]]
        rest = completion_body(
            prompt=first[0]["prompt_token_ids"] + ids[:2],
            max_tokens=4,
            stream=True,
            return_token_ids=True,
        )
        then = [orjson.loads(e) for e in await stream_events(client, "/v1/completions", rest)
                if e != b"[DONE]"]  # fmt: skip
    assert [i for c in then for i in c["choices"][0]["token_ids"]] == ids[2:]
    words = [c["choices"][0]["delta"]["content"] for c in first[1:]]
    assert [c["choices"][0]["text"] for c in then] == words[2:]


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/chat/completions", chat_body), ("/v1/completions", completion_body)]
)
@pytest.mark.parametrize("include_usage", [False, True])
async def test_usage_chunk_comes_only_with_include_usage_and_done_ends_the_stream(
    base_url: str, path: str, body: Any, include_usage: bool
) -> None:
    request = body(max_tokens=3, stream=True, stream_options={"include_usage": include_usage})
    async with client_for(base_url) as client:
        events = await stream_events(client, path, request)
    assert events[-1] == b"[DONE]"
    assert events.count(b"[DONE]") == 1
    chunks = [orjson.loads(event) for event in events[:-1]]
    usages = [chunk["usage"] for chunk in chunks if "usage" in chunk]
    if not include_usage:
        assert usages == []
        return
    assert chunks[-1]["choices"] == []
    assert usages == [chunks[-1]["usage"]]
    usage = usages[0]
    assert usage["completion_tokens"] == 3
    assert usage["total_tokens"] == usage["prompt_tokens"] + 3


async def test_non_streaming_chat_completion_has_vllm_shape(base_url: str) -> None:
    async with client_for(base_url) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=6))
    assert response.status_code == 200
    body = response.json()
    assert list(body) == [
        "id", "object", "created", "model", "choices", "service_tier",
        "system_fingerprint", "usage", "prompt_logprobs", "prompt_token_ids", "kv_transfer_params",
    ]  # fmt: skip
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 6
    assert choice["finish_reason"] == "length"
    assert list(body["usage"]) == [
        "prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
    ]  # fmt: skip
    assert body["usage"]["completion_tokens"] == 6


async def test_non_streaming_text_completion_has_vllm_shape(base_url: str) -> None:
    async with client_for(base_url) as client:
        response = await client.post("/v1/completions", json=completion_body(max_tokens=2))
    assert response.status_code == 200
    body = response.json()
    assert list(body) == [
        "id", "object", "created", "model", "choices", "service_tier",
        "system_fingerprint", "usage", "kv_transfer_params",
    ]  # fmt: skip
    assert body["object"] == "text_completion"
    choice = body["choices"][0]
    assert list(choice) == [
        "index", "text", "logprobs", "finish_reason", "stop_reason",
        "token_ids", "prompt_logprobs", "prompt_token_ids",
    ]  # fmt: skip
    assert len(choice["text"].split()) == 2
    assert body["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_request_id_field_becomes_the_response_id(base_url: str, stream: bool) -> None:
    async with client_for(base_url) as client:
        for path, body, prefix in [
            ("/v1/chat/completions", chat_body, "chatcmpl"),
            ("/v1/completions", completion_body, "cmpl"),
        ]:
            request = body(max_tokens=1, stream=stream, request_id="job-42")
            anonymous = body(max_tokens=1, stream=stream)
            if stream:
                named = orjson.loads((await stream_events(client, path, request))[0])["id"]
                other = orjson.loads((await stream_events(client, path, anonymous))[0])["id"]
            else:
                named = (await client.post(path, json=request)).json()["id"]
                other = (await client.post(path, json=anonymous)).json()["id"]
            assert named == f"{prefix}-job-42"
            assert re.fullmatch(rf"{prefix}-[0-9a-f]{{16}}", other)


@pytest.mark.parametrize(
    ("extra", "tokens", "finish_reason"),
    [
        ({"max_tokens": 7}, 7, "length"),
        ({"max_completion_tokens": 3, "max_tokens": 9}, 3, "length"),
        ({}, FAST.default_output_tokens, "stop"),
    ],
)
async def test_output_length_follows_max_tokens_else_the_profile_default(
    base_url: str, extra: dict[str, int], tokens: int, finish_reason: str
) -> None:
    async with client_for(base_url) as client:
        events = await stream_events(
            client, "/v1/chat/completions", chat_body(stream=True, **extra)
        )
    chunks = [orjson.loads(event) for event in events[:-1]]
    content = [c for c in chunks if chunk_kind(c) in ("token", "final")]
    assert len(content) == tokens
    assert [chunk_kind(c) for c in content][-1] == "final"
    assert content[-1]["choices"][0]["finish_reason"] == finish_reason


# --- metrics -----------------------------------------------------------------------


def families(text: str) -> dict[str, tuple[str, set[tuple[str, frozenset[str]]]]]:
    """name -> (type, {(sample name, label names)})."""
    found = {}
    for family in text_string_to_metric_families(text):
        samples = {(s.name, frozenset(s.labels)) for s in family.samples}
        found[family.name] = (family.type, samples)
    return found


async def test_every_emitted_metric_has_vllm_name_type_and_labels(base_url: str) -> None:
    async with client_for(base_url) as client:
        await client.post("/v1/completions", json=completion_body(max_tokens=2))
        text = await scrape(client)
    vllm = families((FIXTURES / "metrics_load.txt").read_text())
    ours = families(text)
    for name, kind in EMITTED_METRICS.items():
        assert ours[name][0] == kind, name
    own = {name for name in ours if name.startswith("fairq_sim_")}
    # The simulator's own: its steps' modeled time and their overrun, for benchmarks
    assert {"fairq_sim_step_seconds", "fairq_sim_step_overrun_seconds"} <= own
    assert metric_value(text, "fairq_sim_step_seconds_total") > 0
    for name, (kind, samples) in ours.items():
        if name in own:
            continue
        assert name in vllm, f"{name} is not a vLLM 0.32 metric"
        assert kind == vllm[name][0], f"{name}: type {kind}, vLLM has {vllm[name][0]}"
        assert samples <= vllm[name][1], f"{name}: samples or label names differ from vLLM"
    assert metric_value(text, "vllm:num_requests_running", engine="0", model_name=MODEL) >= 0


async def test_batch_limit_of_two_leaves_three_of_five_requests_waiting() -> None:
    profile = SimProfile(max_num_seqs=2, step_base_ms=10.0)
    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client:
            streams = [
                asyncio.create_task(
                    stream_events(
                        client, "/v1/chat/completions", chat_body(max_tokens=30, stream=True)
                    )
                )
                for _ in range(5)
            ]
            await wait_for_metrics(client, num_requests_waiting=3.0, num_requests_running=2.0)
            results = await asyncio.gather(*streams)
            await wait_for_metrics(client, num_requests_waiting=0.0, num_requests_running=0.0)
    for events in results:
        assert len(events) == 1 + 30 + 1  # role chunk, tokens, [DONE]


async def test_client_gone_mid_stream_frees_its_slot_and_counts_an_abort() -> None:
    profile = SimProfile(max_num_seqs=1, step_base_ms=10.0)
    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client:
            request = chat_body(max_tokens=1000, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=request) as response:
                tokens = 0
                async for line in response.aiter_lines():
                    tokens += '"delta":{"content"' in line
                    if tokens == 2:
                        break
            assert tokens == 2
            # Closing the unfinished response dropped the connection.
            await wait_for_metrics(client, num_requests_running=0.0, aborts=1.0)
            # Had the slot stayed taken, this would wait ~10 s for the 1000 tokens.
            started = time.monotonic()
            response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2))
            assert response.status_code == 200
            assert time.monotonic() - started < 2.0


async def test_client_gone_while_waiting_leaves_the_queue_and_counts_an_abort() -> None:
    profile = SimProfile(max_num_seqs=1, step_base_ms=10.0)
    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client, client_for(url) as holder:
            hold = asyncio.create_task(
                stream_events(
                    holder, "/v1/chat/completions", chat_body(max_tokens=300, stream=True)
                )
            )
            await wait_for_metrics(client, num_requests_running=1.0)
            request = chat_body(max_tokens=5, stream=True)
            async with client.stream("POST", "/v1/chat/completions", json=request):
                await wait_for_metrics(client, num_requests_waiting=1.0)
            await wait_for_metrics(
                client, num_requests_waiting=0.0, num_requests_running=1.0, aborts=1.0
            )
            hold.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hold


async def test_each_app_counts_into_its_own_registry() -> None:
    with sim(FAST, [MODEL]) as first, sim(FAST, [MODEL]) as second:
        async with client_for(first) as one, client_for(second) as two:
            await one.post("/v1/completions", json=completion_body(max_tokens=3))
            assert _sample(await scrape(one), "generation_tokens_total") == 3.0
            assert _sample(await scrape(two), "generation_tokens_total") == 0.0


# --- batching, KV cache and priority over HTTP -------------------------------------


async def test_waiting_grows_past_max_num_seqs_and_falls_as_requests_finish() -> None:
    profile = SimProfile(max_num_seqs=4, step_base_ms=10.0)
    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client:
            posts = [
                asyncio.create_task(
                    client.post("/v1/completions", json=completion_body(max_tokens=20))
                )
                for _ in range(12)
            ]
            seen: list[float] = []

            async def waiting() -> list[float]:  # sampled until every request has finished
                seen.append(_sample(await scrape(client), "num_requests_waiting"))
                return seen

            await aeventually(
                waiting,
                "every request to finish (the list: the waiting queue as sampled)",
                DEADLINE_S,
                until=lambda _: all(post.done() for post in posts),
                interval_s=0.01,
            )
            seen.append(_sample(await scrape(client), "num_requests_waiting"))
            responses = await asyncio.gather(*posts)
    assert [r.status_code for r in responses] == [200] * 12
    # 12 requests, 4 slots: once the scheduler's next step has run, 8 wait. A scrape
    # between the arrivals and that step may see up to 12, as on a real engine.
    assert 8.0 in seen and max(seen) <= 12.0, seen
    after = seen[seen.index(8.0) :]
    assert after == sorted(after, reverse=True)  # it only falls once all have arrived
    assert 4.0 in after  # the first wave of 4 finished while 4 more still waited
    assert after[-1] == 0.0


async def test_preempted_streamed_request_never_repeats_a_token() -> None:
    # 16 KV blocks of 16 tokens; four requests growing to ~8 blocks each must preempt.
    profile = SimProfile(max_num_seqs=4, kv_cache_tokens=256, max_model_len=256, step_base_ms=1.0)
    max_tokens = 120
    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client:
            bodies = [
                chat_body(max_tokens=max_tokens, request_id=f"p{i}", stream=True) for i in range(4)
            ]
            streams = await asyncio.gather(
                *(stream_events(client, "/v1/chat/completions", body) for body in bodies)
            )
            preemptions = _sample(await scrape(client), "num_preemptions_total")
            # Same request id, same text: the non-streamed answer is the reference.
            answers = [
                await client.post("/v1/chat/completions", json={**body, "stream": False})
                for body in bodies
            ]
    references = [answer.json()["choices"][0]["message"]["content"] for answer in answers]
    assert preemptions > 0
    for events, reference in zip(streams, references, strict=True):
        chunks = [orjson.loads(event) for event in events[:-1]]
        tokens = [c["choices"][0]["delta"]["content"] for c in chunks if chunk_kind(c) != "role"]
        assert len(tokens) == max_tokens
        assert "".join(tokens) == reference


async def test_higher_priority_request_takes_the_next_free_slot_without_preempting() -> None:
    profile = SimProfile(max_num_seqs=2, step_base_ms=10.0, scheduling_policy="priority")
    finished: list[str] = []

    async def complete(client: httpx.AsyncClient, name: str, priority: int, tokens: int) -> None:
        body = chat_body(max_tokens=tokens, priority=priority)
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        finished.append(name)

    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client:
            lows = [
                asyncio.create_task(complete(client, f"low{i}", priority=10, tokens=30))
                for i in range(4)
            ]
            await wait_for_metrics(client, num_requests_running=2.0, num_requests_waiting=2.0)
            await complete(client, "high", priority=0, tokens=5)
            await asyncio.gather(*lows)
            preemptions = _sample(await scrape(client), "num_preemptions_total")
    # The batch was full: "high" waited for the first two to end, then went ahead of the
    # two that had waited longer (FCFS would have served it after all four), as vLLM does.
    assert finished[2] == "high"
    assert preemptions == 0.0


async def test_under_fcfs_a_priority_is_taken_and_ignored_as_vllm_0_32_does() -> None:
    # vLLM's V0 engine refused it ("Priority scheduling is not enabled"); 0.32 serves it,
    # in arrival order: whether an engine runs the priority policy shows in no error.
    # 100 ms steps: each answer runs 0.5 s, so that on a loaded machine the later request
    # is still seen waiting, and the urgent one comes while it waits (with 10 ms steps the
    # first answer once ended before the later one was seen waiting).
    profile = SimProfile(max_num_seqs=1, step_base_ms=100.0)
    finished: list[str] = []

    async def complete(client: httpx.AsyncClient, name: str, priority: int) -> None:
        body = chat_body(max_tokens=5, priority=priority)
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        finished.append(name)

    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client:
            first = asyncio.create_task(complete(client, "first", priority=10))
            await wait_for_metrics(client, num_requests_running=1.0)
            later = asyncio.create_task(complete(client, "later", priority=10))
            await wait_for_metrics(client, num_requests_waiting=1.0)
            await complete(client, "urgent", priority=-1)
            await asyncio.gather(first, later)
    assert finished == ["first", "later", "urgent"]


@pytest.mark.parametrize(("policy", "as_json"), [("fcfs", True), ("priority", False)])
async def test_in_dev_mode_server_info_says_the_scheduling_policy_as_vllm_does(
    policy: Literal["fcfs", "priority"], as_json: bool
) -> None:
    profile = SimProfile(scheduling_policy=policy, dev_mode=True)
    query = "?config_format=json" if as_json else ""
    with sim(profile, [MODEL]) as url:
        async with client_for(url) as client:
            info = (await client.get(f"/server_info{query}")).json()
    config = info["vllm_config"]
    if as_json:
        assert config["scheduler_config"]["policy"] == policy
        assert config["model_config"]["served_model_name"] == MODEL
    else:  # vLLM's default: the configuration as one string
        assert f"'policy': '{policy}'" in config


async def test_without_dev_mode_there_is_no_server_info(base_url: str) -> None:
    async with client_for(base_url) as client:
        assert (await client.get("/server_info?config_format=json")).status_code == 404


# --- errors and small routes -------------------------------------------------------


async def test_unknown_model_is_404_in_vllm_error_shape(base_url: str) -> None:
    async with client_for(base_url) as client:
        response = await client.post("/v1/chat/completions", json={**chat_body(), "model": "nope"})
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


@pytest.mark.parametrize(
    ("body", "numbers", "param"),
    [
        (completion_body(prompt="abcd" * 5000), ["4096", "5000 input tokens"], "input_tokens"),
        (
            completion_body(prompt="abcd" * 100, max_tokens=4000),
            ["4000", "4096", "100 input tokens"],
            "max_tokens",
        ),
    ],
)
async def test_too_long_request_is_400_naming_the_lengths_and_the_param_as_vllm_does(
    base_url: str, body: dict[str, Any], numbers: list[str], param: str
) -> None:
    async with client_for(base_url) as client:
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert list(error) == ["message", "type", "param", "code"]
    assert (error["type"], error["param"], error["code"]) == ("BadRequestError", param, 400)
    for number in numbers:
        assert number in error["message"]


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b'{"model": "tiny"}'),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": []}'),
        ("/v1/completions", b'{"model": "tiny"}'),
        ("/v1/completions", b'["a list"]'),
        ("/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": 0}'),
    ],
)
async def test_malformed_requests_are_400(base_url: str, path: str, content: bytes) -> None:
    async with client_for(base_url) as client:
        response = await client.post(path, content=content)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"


async def test_models_lists_served_models_and_health_is_empty_200() -> None:
    with sim(FAST, ["tiny", "big"]) as url:
        async with client_for(url) as client:
            models = (await client.get("/v1/models")).json()
            health = await client.get("/health")
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
        ("tiny", "model", "vllm"),
        ("big", "model", "vllm"),
    ]
    assert (health.status_code, health.content) == (200, b"")


def test_openai_client_streams_a_chat_completion(base_url: str) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    with client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Say something"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5


# --- profiles ----------------------------------------------------------------------


def test_default_profile_file_matches_the_model_defaults() -> None:
    assert load_profile(None) == SimProfile()
    assert load_profile("default") == SimProfile()


def test_profile_file_is_loaded_and_unknown_keys_are_rejected(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("max_num_seqs: 4\nstep_base_ms: 20\n")
    assert load_profile(str(good)) == SimProfile(max_num_seqs=4, step_base_ms=20.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_num_seqs: 4\nmax_num_seq: 8\n")
    with pytest.raises(ProfileError, match="max_num_seq'"):
        load_profile(str(bad))
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(str(tmp_path / "missing.yaml"))


def test_shipped_profiles_load_by_name_and_h100_8b_describes_a_big_engine() -> None:
    h100 = load_profile("h100-8b")
    assert (h100.max_num_seqs, h100.max_num_batched_tokens, h100.block_size) == (256, 8192, 16)
    assert 200_000 <= h100.kv_cache_tokens <= 600_000  # ~128 KiB per token, ~50 GB
    # ~7 ms at batch 1, 25-35 ms at a full batch, 15-20k prefill tokens/s.
    assert 0.006 <= step_duration_s(h100, 1, 0) <= 0.008
    assert 0.025 <= step_duration_s(h100, 256, 0) <= 0.035
    assert 0.05 <= h100.prefill_ms_per_token <= 0.067


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("max_num_seqs: 64\nmax_num_batched_tokens: 32\n", "at least max_num_seqs"),
        ("kv_cache_tokens: 1000\nmax_model_len: 2000\n", "cannot hold one sequence"),
        ("scheduling_policy: lifo\n", "scheduling_policy"),
    ],
)
def test_profile_that_vllm_would_refuse_to_start_with_is_rejected(
    tmp_path: Path, text: str, complaint: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=complaint):
        load_profile(str(path))


# --- scheduler (pure: hand-made states, no clock) ----------------------------------


def scheduler(**settings: Any) -> Scheduler[SchedSeq]:
    return Scheduler(SimProfile(**settings))


def request(prompt: int, max_tokens: int = 100, priority: int = 0) -> SchedSeq:
    return SchedSeq(prompt_tokens=prompt, max_tokens=max_tokens, priority=priority)


def step(sched: Scheduler[SchedSeq]) -> StepPlan[SchedSeq]:
    plan = sched.schedule()
    sched.complete(plan)
    return plan


def put_running(sched: Scheduler[SchedSeq], seq: SchedSeq, *, computed: int) -> None:
    """Hand-make a running request holding the blocks its computed tokens need."""
    sched.add(seq)  # assigns its arrival order
    sched.waiting.remove(seq)
    seq.status = SeqStatus.RUNNING
    seq.computed = computed
    seq.blocks = -(-computed // 16)
    sched.free_blocks -= seq.blocks
    sched.running[seq] = None


def test_token_budget_limits_prefill_per_step_and_a_long_prompt_spans_steps() -> None:
    profile = SimProfile(max_num_seqs=8, max_num_batched_tokens=100, prefill_ms_per_token=0.5)
    sched: Scheduler[SchedSeq] = Scheduler(profile)
    long, short = request(250), request(30)
    sched.add(long)
    sched.add(short)
    first = step(sched)
    assert first.scheduled == {long: 100}  # the budget is spent: `short` must wait
    assert first.duration_s == step_duration_s(profile, 0, 100)
    assert (long.generated, list(sched.waiting)) == (0, [short])
    assert step(sched).scheduled == {long: 100}
    third = step(sched)
    assert third.scheduled == {long: 50, short: 30}
    # Only the step that completes a prefill emits the first token.
    assert (long.generated, short.generated) == (1, 1)
    fourth = step(sched)
    assert (fourth.decode_seqs, fourth.prefill_tokens) == (2, 0)


def test_running_decodes_take_their_token_before_an_earlier_request_prefills() -> None:
    sched = scheduler(max_num_batched_tokens=64)
    prefilling, decoding = request(500), request(10)
    put_running(sched, prefilling, computed=100)
    put_running(sched, decoding, computed=10)
    decoding.generated = 1
    plan = sched.schedule()
    assert plan.scheduled == {decoding: 1, prefilling: 63}


def test_admission_stops_at_max_num_seqs_until_a_slot_frees() -> None:
    sched = scheduler(max_num_seqs=3)
    requests = [request(10, max_tokens=2) for _ in range(5)]
    for seq in requests:
        sched.add(seq)
    assert step(sched).admitted == requests[:3]
    assert len(sched.waiting) == 2
    assert step(sched).admitted == []  # all slots busy while the first three decode
    assert [seq.status for seq in requests[:3]] == [SeqStatus.FINISHED] * 3
    assert step(sched).admitted == requests[3:]


def test_kv_exhaustion_preempts_the_most_recently_admitted_which_refills_first() -> None:
    # 4 blocks of 16 tokens: two 31-token prompts fill them after their first output token.
    sched = scheduler(kv_cache_tokens=64, max_model_len=64, max_num_seqs=4)
    first, second, later = request(31, max_tokens=4), request(31), request(5)
    sched.add(first)
    sched.add(second)
    step(sched)
    sched.add(later)
    assert step(sched).admitted == []  # no free block for `later`
    assert sched.free_blocks == 0
    plan = step(sched)  # `first` needs a third block for its 33rd token
    assert (plan.preempted, plan.scheduled) == ([second], {first: 1})
    assert (second.status, second.computed, second.blocks) == (SeqStatus.WAITING, 0, 0)
    assert list(sched.waiting) == [second, later]  # back at the front
    step(sched)  # `first` finishes; `second` (33 tokens to refill) does not fit yet
    assert first.status is SeqStatus.FINISHED
    refill = step(sched)
    # Prompt + the 2 tokens it had emitted, recomputed; its output goes on at token 3.
    assert refill.scheduled[second] == 31 + 2
    assert second.generated == 3


def test_a_step_that_preempts_admits_nothing_not_even_its_victim() -> None:
    # 4 blocks, all held; a budget of 8 would let the victim refill 7 tokens in 1 block.
    sched = scheduler(
        kv_cache_tokens=64, max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8
    )
    grower, victim = request(30), request(28)
    put_running(sched, grower, computed=32)
    put_running(sched, victim, computed=30)
    grower.generated = victim.generated = 3
    plan = step(sched)
    assert (plan.preempted, plan.admitted, plan.scheduled) == ([victim], [], {grower: 1})
    # vLLM does the same: re-admitting at once would only preempt again.
    assert step(sched).scheduled == {grower: 1, victim: 7}


def test_kv_exhaustion_under_priority_preempts_the_worst_priority_not_the_latest() -> None:
    sched = scheduler(kv_cache_tokens=64, max_model_len=64, scheduling_policy="priority")
    low, high = request(31, priority=9), request(31, priority=0)
    for seq in (low, high):
        put_running(sched, seq, computed=32)
        seq.generated = 2
    plan = sched.schedule()
    assert (plan.preempted, plan.scheduled) == ([low], {high: 1})


def test_priority_policy_orders_the_waiting_queue_by_priority_then_arrival() -> None:
    priorities = [5, 0, 5, -1, 0]
    for policy, order in [("priority", [3, 1, 4, 0, 2]), ("fcfs", [0, 1, 2, 3, 4])]:
        sched = scheduler(scheduling_policy=policy)
        seqs = [request(10, priority=p) for p in priorities]
        for seq in seqs:
            sched.add(seq)
        assert [seqs.index(seq) for seq in sched.waiting] == order, policy
        assert [seqs.index(seq) for seq in step(sched).admitted] == order, policy


def test_a_better_priority_waits_for_a_free_slot_then_goes_ahead_of_worse_ones() -> None:
    # vLLM 0.32 never preempts a running request to free a slot for a better priority.
    sched = scheduler(max_num_seqs=2, scheduling_policy="priority")
    early, late = request(5, priority=5, max_tokens=2), request(5, priority=5, max_tokens=9)
    sched.add(early)
    sched.add(late)
    step(sched)
    equal, urgent = request(10, priority=5), request(10, priority=0)
    sched.add(equal)
    sched.add(urgent)
    plan = step(sched)  # early's second (and last) token: no slot was free for the step
    assert (plan.preempted, plan.admitted) == ([], [])
    assert step(sched).admitted == [urgent]  # early's slot, ahead of `equal`
    assert list(sched.waiting) == [equal]


# --- process -----------------------------------------------------------------------


def test_sigterm_cuts_open_streams_and_serve_exits_with_status_0() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    code = f"from sim import serve, SimProfile; serve('127.0.0.1', {port}, ['tiny'], SimProfile())"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env)
    try:
        wait_healthy(f"{url}/health", proc, "serve()", 15)
        request = completion_body(max_tokens=3000, stream=True)
        with httpx.stream("POST", f"{url}/v1/completions", json=request) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: {")
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            rest = list(lines)
        # Cut, not drained: 3000 tokens would take ~20 s, and no [DONE] ends it.
        assert "data: [DONE]" not in rest
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - signalled < 2.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
