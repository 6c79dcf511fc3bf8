"""Against a real vLLM 0.32 (CPU build, the benchmarks' tiny model). Exact resume: alice's
long streamed answers fill the batch, bob comes, one of hers is taken back mid-answer and
goes on from token ids. Every answer is then checked against the model's tokenizer: its
text is the tokenizer's text of the answer's token ids, which are as many as she asked
for and as her usage counts, and her client saw none of the ids. Whole answers: a request
not streamed, which fairq streams from the engine and rebuilds, gets vLLM's own answer.

Slow (vLLM starts in about 30 s): it runs only with ``FAIRQ_TEST_VLLM=1``, and after
``make bench-vllm-setup`` (or with ``FAIRQ_VLLM_HOME`` naming a home that has vLLM).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from redis import Redis

from benchmarks.fairness.resumed import problems, read_answer, tokenizer_decode
from benchmarks.lib.vllm_engine import has_model, is_installed, resolve_home, running_vllm
from broker import Client, keys
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack, demo_config
from tests.support import local_http
from tests.support.settings import make_settings

pytestmark = pytest.mark.integration

BATCH = 4
LONG_TOKENS = 440  # the tiny model's context is 512
MODEL = "tiny"


def _why_not() -> str | None:
    if os.environ.get("FAIRQ_TEST_VLLM") != "1":
        return "slow (a real vLLM starts in ~30 s): FAIRQ_TEST_VLLM=1 runs it"
    home = resolve_home()
    if not (is_installed(home) and has_model(home)):
        return f"no vLLM and tiny model in {home.root} (make bench-vllm-setup)"
    return None


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    reason = _why_not()
    if reason is not None:
        pytest.skip(reason)
    with running_vllm(port=free_port(), policy="fcfs", max_num_seqs=BATCH) as url:
        yield url


def test_an_answer_taken_back_mid_way_goes_on_token_for_token(
    vllm_url: str, redis_url: str
) -> None:
    config = demo_config([1, 2])
    config["models"] = [{"name": MODEL, "engine": "vllm", "endpoints": [vllm_url],
                         "batch_slots": BATCH, "reserved_slots": 0,
                         "allow_fields": ["ignore_eos"]}]  # fmt: skip
    with Stack(config, gateway_port=0, redis_url=redis_url, gateway=False) as stack:
        settings = make_settings(redis_url, **stack.config)
        with Client(settings, api_key="fq-demo-alice") as alice, \
                Client(settings, api_key="fq-demo-bob") as bob:  # fmt: skip
            flood = [
                alice.submit(MODEL, messages=[{"role": "user", "content": f"tell me {i}"}],
                             max_tokens=LONG_TOKENS, ignore_eos=True, stream=True,
                             stream_options={"include_usage": True})
                for i in range(2 * BATCH)
            ]  # fmt: skip
            for _ in range(3):  # on a machine this busy, a wave can end before bob comes
                if not _wait_for_output(redis_url, flood):
                    break
                job = bob.submit(MODEL, messages=[{"role": "user", "content": "hi"}],
                                 max_tokens=4, stream=True)  # fmt: skip
                assert len([c for c in bob.stream(job) if c.get("choices")]) >= 4
                if _resumed(redis_url, flood):
                    break
            for job_id in flood:
                list(alice.stream(job_id))  # until it ends
    assert _resumed(redis_url, flood), "no answer was taken back mid-way"
    redis = Redis.from_url(redis_url)
    try:
        answers = [read_answer(redis, MODEL, job_id) for job_id in flood]
    finally:
        redis.close()
    home = resolve_home()
    decode = tokenizer_decode(home.python, home.model / "tokenizer.json")
    assert problems(answers, "vllm", decode) == []
    for answer in answers:
        assert len(answer.ids) == LONG_TOKENS
        assert answer.chunks[-1]["usage"]["prompt_tokens"] == len(answer.prompt_ids)
        assert all(c.get("prompt_token_ids") is None for c in answer.chunks)
        assert all(ch.get("token_ids") is None for c in answer.chunks for ch in c["choices"])


def _resumed(redis_url: str, jobs: list[str]) -> list[str]:
    """The jobs taken back mid-answer so far."""
    with Redis.from_url(redis_url) as redis:
        return [j for j in jobs if redis.hexists(keys.job(MODEL, j), "pkm")]


# Result entries that make an answer mid-way: a job taken back before its first token and
# sent again has its earlier attempt's opening entries, and its new attempt may still wait
# in the engine's queue (then bob would find a free slot, and nothing is taken mid-way).
_MID_WAY = 8


def _wait_for_output(redis_url: str, jobs: list[str]) -> bool:
    """Until a batch of alice's answers is running and each has sent several tokens: they
    are mid-answer (each takes a second or more here, so bob comes while they run). False
    when fewer than a batch of them are left."""
    deadline = time.monotonic() + 30
    with Redis.from_url(redis_url) as redis:
        while time.monotonic() < deadline:
            states = [redis.hget(keys.job(MODEL, j), "st") for j in jobs]
            running = [j for j, st in zip(jobs, states, strict=True) if st == b"running"]
            if sum(redis.xlen(keys.results(MODEL, j)) >= _MID_WAY for j in running) >= BATCH:
                return True
            if sum(st != b"completed" for st in states) < BATCH:
                return False
            time.sleep(0.01)
    raise AssertionError("alice's answers never filled the batch")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "tell me more"}]}),
        ("/v1/completions", {"prompt": "def main():"}),
    ],
)
def test_a_whole_answer_rebuilt_from_the_stream_is_vllms_own_whole_answer(
    vllm_url: str, redis_url: str, path: str, body: dict[str, object]
) -> None:
    # The same greedy request, straight to vLLM and through fairq, which streams it from
    # the engine and rebuilds the whole answer (workers/whole.py).
    request = {"model": MODEL, "max_tokens": 24, "temperature": 0.0, **body}
    direct = local_http.post(vllm_url + path, json=request, timeout=60).json()
    config = demo_config([1, 2])
    config["models"] = [{"name": MODEL, "engine": "vllm", "endpoints": [vllm_url]}]
    with Stack(config, gateway_port=0, redis_url=redis_url, gateway=False) as stack:
        settings = make_settings(redis_url, **stack.config)
        with Client(settings, api_key="fq-demo-alice") as alice:
            job_id = alice.submit(MODEL, **{k: v for k, v in request.items() if k != "model"})
            rebuilt = alice.result(job_id)
            assert alice.status(job_id).first_token_ms is not None
    left_out = {k: v for k, v in direct.items() if k not in rebuilt}
    assert all(v is None for v in left_out.values()), left_out
    for key in set(rebuilt) - {"id", "created", "choices"}:
        assert _set(rebuilt[key]) == _set(direct[key]), key
    (mine,), (theirs,) = rebuilt["choices"], direct["choices"]
    assert all(theirs[k] == v for k, v in mine.items() if k != "message"), (mine, theirs)
    if "message" in mine:
        assert {k: v for k, v in theirs["message"].items() if v} == mine["message"]


def _set(value: object) -> object:
    """An object's members that are not null (a whole answer's usage has null ones)."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value
