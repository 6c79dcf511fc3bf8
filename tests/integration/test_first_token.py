"""A newcomer's first token while one user's long answers fill the engine's batch, with
real processes: fairq keeps a batch slot for users with nothing in the engine, so the
newcomer starts within a few engine steps instead of after someone's long generation."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from broker import Client, keys
from fairq.stack.processes import DEMO_MODELS
from sim._wire import WORDS, output_text
from tests.support import local_http
from tests.support.eventually import eventually
from tests.support.settings import make_settings
from tests.support.stack import demo_stack, sim_port

pytestmark = pytest.mark.integration

STEP_MS = 8.0
BATCH = 4
# Each of alice's answers takes LONG_TOKENS steps (~3 s): bob must not wait for one to end.
LONG_TOKENS = 400
ENGINE = {"max_num_seqs": BATCH, "step_base_ms": STEP_MS, "step_per_seq_ms": 0.0}


def engine_gauges(port: int) -> dict[str, float]:
    text = local_http.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    wanted = {"vllm:num_requests_running", "vllm:num_requests_waiting"}
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in wanted
    }


def wait_for_full_batch(port: int, running: int, waiting: int = 0) -> dict[str, float]:
    return eventually(
        lambda: engine_gauges(port),
        f"the engine to run {running} of alice's requests with {waiting} waiting",
        20,
        until=lambda gauges: (
            gauges["vllm:num_requests_running"] >= running
            and gauges["vllm:num_requests_waiting"] >= waiting
        ),
        interval_s=0.05,
    )


def first_token_s(client: Client, model: str) -> float:
    started = time.monotonic()
    job_id = client.submit(
        model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    for chunk in client.stream(job_id):
        if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
            return time.monotonic() - started
    raise AssertionError("bob's stream ended without content")


def assert_whole_once(client: Client, job_id: str, *, stream: bool) -> None:
    """The answer has every token once, and its usage counts them once."""
    if not stream:
        assert client.result(job_id)["usage"]["completion_tokens"] == LONG_TOKENS
        return
    chunks = list(client.stream(job_id))
    tokens = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("content")]
    roles = [c for c in chunks if c.get("choices") and c["choices"][0]["delta"].get("role")]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(tokens) == LONG_TOKENS and len(roles) == 1
    assert usage[-1]["completion_tokens"] == LONG_TOKENS
    assert {(c["id"], c["created"], c["model"]) for c in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], chunks[0]["model"])
    }
    assert_one_walk("".join(c["choices"][0]["delta"]["content"] for c in tokens))


def assert_one_walk(text: str) -> None:
    """The simulator's answer is a walk through its word list from one start (its tokens
    are a function of their positions, sim/_tokens.py): a token repeated or lost
    anywhere breaks the walk."""
    starts = [seed for seed in range(len(WORDS)) if output_text(seed, LONG_TOKENS) == text]
    assert starts, f"the answer is not one walk of the simulator's words: {text[:200]!r}..."


def newcomer_during_long_flood(
    redis_url: str,
    tmp_path: Path,
    model_overrides: dict[str, Any],
    running: int,
    *,
    stream: bool = True,
    finish: bool = False,
    engine: dict[str, Any] | None = None,
    waiting: int = 0,
) -> tuple[float, dict[str, float]]:
    """Alice fills the batch with long answers; bob's TTFT once she has ``running`` of them
    in the engine and ``waiting`` more in its queue, and the engine's gauges at that
    moment. With ``finish``, every one of alice's requests must then complete whole (else
    they are cancelled). ``engine``: the simulator's profile keys that differ from
    ``ENGINE``."""
    profile = tmp_path / "engine.yaml"
    profile.write_text(yaml.safe_dump(ENGINE | (engine or {})))
    with demo_stack(
        per_model={DEMO_MODELS[0]: model_overrides},
        profile=profile,
        redis_url=redis_url,
        gateway=False,
    ) as stack:
        settings = make_settings(redis_url, **stack.config)
        with Client(settings, api_key="fq-demo-alice") as alice, \
                Client(settings, api_key="fq-demo-bob") as bob:  # fmt: skip
            prompt = [{"role": "user", "content": "tell me everything"}]
            options = {"stream_options": {"include_usage": True}} if stream else {}
            flood = [
                alice.submit(
                    DEMO_MODELS[0], messages=prompt, max_tokens=LONG_TOKENS, stream=stream,
                    **options,
                )
                for _ in range(2 * BATCH)
            ]  # fmt: skip
            gauges = wait_for_full_batch(sim_port(stack, DEMO_MODELS[0]), running, waiting)
            ttft = first_token_s(bob, DEMO_MODELS[0])
            if finish:
                for job_id in flood:
                    assert_whole_once(alice, job_id, stream=stream)
            for job_id in flood:
                alice.cancel(job_id)
    return ttft, gauges


def test_a_newcomer_starts_within_a_few_steps_while_long_answers_fill_the_batch(
    redis_url: str, tmp_path: Path
) -> None:
    # The engine's batch configured, one slot kept.
    ttft, gauges = newcomer_during_long_flood(
        redis_url, tmp_path, {"batch_slots": BATCH, "reserved_slots": 1}, running=BATCH - 1
    )
    # The flood waits in fairq, not in the engine, and one slot stays free.
    assert gauges["vllm:num_requests_waiting"] == 0
    assert gauges["vllm:num_requests_running"] == BATCH - 1
    # A few engine steps (8 ms each) plus fairq's hops; one of alice's answers takes ~5 s.
    assert ttft < 0.5, f"bob's first token took {ttft:.2f} s"


def test_without_kept_slots_a_newcomer_waits_for_someone_elses_generation_to_end(
    redis_url: str, tmp_path: Path
) -> None:
    # The contrast: the queue target alone lets the flood fill the batch and the engine's
    # queue, and bob waits until one of alice's long answers ends.
    ttft, _ = newcomer_during_long_flood(
        redis_url, tmp_path, {"batch_slots": 0, "reserved_slots": 0}, running=BATCH
    )
    assert ttft > 2.0, f"bob's first token took only {ttft:.2f} s"


def test_preemption_takes_a_running_job_without_output_back_for_a_newcomer(
    redis_url: str, tmp_path: Path
) -> None:
    # No kept slot: alice's answers (not streamed: no output until they end) fill the
    # batch; bob's request goes to the head of the engine's queue and one of alice's is
    # taken back out of the engine, to run again later from scratch.
    overrides = {"batch_slots": BATCH, "reserved_slots": 0, "preemption": True}
    ttft, _ = newcomer_during_long_flood(
        redis_url, tmp_path, overrides, running=BATCH, stream=False, finish=True
    )
    assert ttft < 0.5, f"bob's first token took {ttft:.2f} s"


def test_preemption_clears_the_engine_queue_of_a_learned_batch(
    redis_url: str, tmp_path: Path
) -> None:
    # The batch learned from the metrics: by then alice's requests (not streamed) wait in
    # the engine's queue too (bob comes once the engine is seen so: a look as its batch
    # filled found none waiting yet once). They are taken back, and then one running, for bob.
    overrides = {"batch_slots": None, "preemption": True}
    ttft, _ = newcomer_during_long_flood(
        redis_url, tmp_path, overrides, running=BATCH, stream=False, waiting=1
    )
    # Three of alice's requests are taken back from the engine's queue, then one running
    # (each at a step's end, after the scrape that shows them): 0.65-1.34 s over 18 runs on
    # a 2-core machine, where waiting for one of her answers to end takes 3.2 s.
    assert ttft < LONG_TOKENS * STEP_MS / 1000 / 2, f"bob's first token took {ttft:.2f} s"


def test_preemption_takes_a_streamed_answer_back_and_it_goes_on_with_no_token_twice(
    redis_url: str, tmp_path: Path
) -> None:
    # Alice's answers stream: one is taken back out of the engine mid-answer for bob, and
    # goes on later, on any worker, from the token ids recorded beside her chunks
    # (resume_streams "exact", the default).
    overrides = {"batch_slots": BATCH, "reserved_slots": 0, "preemption": True}
    before = taken_back(redis_url)
    ttft, _ = newcomer_during_long_flood(
        redis_url, tmp_path, overrides, running=BATCH, stream=True, finish=True
    )
    assert ttft < 0.5, f"bob's first token took {ttft:.2f} s"
    # And every answer was whole: each token once, in the order of an uncut answer.
    assert taken_back(redis_url) > before
    assert taken_back(redis_url, mid_answer=True) > 0


def test_without_token_ids_from_the_engine_no_answer_is_taken_back_mid_way(
    redis_url: str, tmp_path: Path
) -> None:
    # An engine that ignores return_token_ids: an answer could only go on from its text,
    # which the engine tokenises anew; by default it stays, and bob waits for a slot.
    overrides = {"batch_slots": BATCH, "reserved_slots": 0, "preemption": True}
    ttft, _ = newcomer_during_long_flood(
        redis_url, tmp_path, overrides, running=BATCH, stream=True, finish=True,
        engine={"return_token_ids": False},
    )  # fmt: skip
    assert taken_back(redis_url, mid_answer=True) == 0
    # A job still without output when bob came (one waiting in the engine, or running
    # before its first token reached fairq) may be taken back from scratch: then bob gets
    # its slot at once. Else he waits for one of the long answers to end.
    if taken_back(redis_url) == 0:
        assert ttft > 1.0, f"bob's first token took only {ttft:.2f} s"


def taken_back(redis_url: str, *, mid_answer: bool = False) -> int:
    """Times jobs of the demo model were taken back out of the engine so far ('pk'); with
    ``mid_answer``, the jobs taken back mid-answer at least once ('pkm')."""
    redis = Redis.from_url(redis_url)
    try:
        found = redis.scan_iter(keys.job(DEMO_MODELS[0], "*"))
        if mid_answer:
            return sum(1 for key in found if redis.hexists(key, "pkm"))
        return sum(int(redis.hget(key, "pk") or 0) for key in found)
    finally:
        redis.close()
