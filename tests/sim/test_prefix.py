"""The simulator's prefix cache: block hashes, the LRU, the scheduler's use of hits, and
vLLM's prefix-cache counters on /metrics."""

from __future__ import annotations

from typing import Any

import httpx

from sim import SimProfile
from sim._parsing import parse_request
from sim._prefix import PrefixCache, block_hashes
from sim._scheduler import SchedSeq, Scheduler, step_duration_s
from tests.sim.test_sim import metric_value
from tests.support.stack import sim

MODEL = "tiny"
BLOCK_CHARS = 16 * 4  # one block of 16 tokens at the simulator's 4 characters a token


def test_prompts_that_share_leading_text_share_their_leading_blocks_only() -> None:
    shared = "s" * (2 * BLOCK_CHARS)
    one = block_hashes(shared + "a" * BLOCK_CHARS, 16, 100)
    two = block_hashes(shared + "b" * BLOCK_CHARS + shared, 16, 100)
    assert len(one) == 3 and len(two) == 5
    assert one[:2] == two[:2] and one[2] != two[2]
    # Chained: the same text after a different start is a different block.
    assert two[3] != one[0]


def test_only_full_blocks_are_hashed_and_at_most_the_limit() -> None:
    assert len(block_hashes("x" * (BLOCK_CHARS - 1), 16, 100)) == 0
    assert len(block_hashes("x" * (5 * BLOCK_CHARS), 16, 2)) == 2
    assert block_hashes(list(range(40)), 16, 100) == block_hashes(list(range(32)), 16, 100)


def test_a_hit_run_stops_at_the_first_missing_block_and_at_the_limit() -> None:
    cache = PrefixCache(capacity_blocks=10)
    cache.touch([1, 2, 4])
    assert cache.hits([1, 2, 3, 4], limit=4) == 2
    assert cache.hits([1, 2, 4], limit=1) == 1
    assert cache.hits([9, 1], limit=2) == 0


def test_the_least_recently_used_blocks_go_first_and_a_prompts_tail_before_its_head() -> None:
    cache = PrefixCache(capacity_blocks=3)
    cache.touch([1, 2])
    cache.touch([5])
    cache.touch([1])  # refreshed: now 2 is the oldest
    cache.touch([7])
    assert (cache.hits([1], 1), cache.hits([5], 1), cache.hits([7], 1)) == (1, 1, 1)
    assert cache.hits([2], 1) == 0
    cache = PrefixCache(capacity_blocks=2)
    cache.touch([10, 11, 12])  # the prompt's last block is evicted first
    assert cache.hits([10, 11], 2) == 2
    assert PrefixCache(capacity_blocks=0).hits([1], 1) == 0


def _seq(prompt: int, blocks: tuple[int, ...], max_tokens: int = 2) -> SchedSeq:
    return SchedSeq(prompt_tokens=prompt, max_tokens=max_tokens, prefix_blocks=blocks)


def _run(sched: Scheduler[SchedSeq], seq: SchedSeq) -> list[int]:
    """Add ``seq`` and step until it ends; the prefill tokens of each step."""
    sched.add(seq)
    prefills = []
    while sched.has_work:
        plan = sched.schedule()
        prefills.append(plan.prefill_tokens)
        sched.complete(plan)
    return prefills


def test_a_prompt_seen_before_prefills_only_what_the_cache_lacks() -> None:
    profile = SimProfile(prefill_ms_per_token=1.0)
    sched: Scheduler[SchedSeq] = Scheduler(profile)
    first = _seq(100, (1, 2, 3, 4, 5, 6))  # 6 full blocks of 16, then 4 tokens
    assert _run(sched, first)[0] == 100
    longer = _seq(150, (1, 2, 3, 4, 7, 8, 9))  # shares the first 4 blocks (64 tokens)
    plan = sched.schedule()
    assert plan.prefill_tokens == 0 and not plan.scheduled  # nothing was added yet
    sched.add(longer)
    plan = sched.schedule()
    assert plan.prefill_tokens == 150 - 64 and longer.cached == 64
    assert plan.duration_s == step_duration_s(profile, 0, 150 - 64)


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    sched: Scheduler[SchedSeq] = Scheduler(SimProfile())
    blocks = (1, 2)
    _run(sched, _seq(32, blocks))
    again = _seq(32, blocks)
    sched.add(again)
    plan = sched.schedule()
    # 32 tokens in two full blocks: only the first may hit, the second is computed again.
    assert (again.cached, plan.scheduled[again]) == (16, 16)


def test_without_prefix_caching_every_prompt_prefills_in_full() -> None:
    sched: Scheduler[SchedSeq] = Scheduler(SimProfile(enable_prefix_caching=False))
    _run(sched, _seq(64, (1, 2, 3, 4)))
    assert _run(sched, _seq(64, (1, 2, 3, 4)))[0] == 64


def test_chat_turns_share_blocks_with_the_turn_before() -> None:
    profile = SimProfile()
    system = {"role": "system", "content": "You are terse. " * 40}
    turn1 = [system, {"role": "user", "content": "What is a queue? " * 10}]
    turn2 = [*turn1, {"role": "assistant", "content": "A line."}, {"role": "user", "content": "?"}]
    other = [system, {"role": "user", "content": "Name a prime. " * 10}]

    def blocks(messages: list[dict[str, Any]]) -> tuple[int, ...]:
        body = httpx.Request("POST", "/", json={"model": MODEL, "messages": messages}).content
        return parse_request(body, chat=True, models=[MODEL], profile=profile).prefix_blocks

    one, two, three = blocks(turn1), blocks(turn2), blocks(other)
    assert len(two) >= len(one) > 0 and two[: len(one)] == one
    shared = len(system["content"]) // BLOCK_CHARS
    assert one[: shared - 1] == three[: shared - 1] and one[shared + 1] != three[shared + 1]


async def test_metrics_count_queried_and_cached_tokens_as_vllm_does() -> None:
    profile = SimProfile(step_base_ms=1.0, default_output_tokens=2)
    prompt = "p" * (10 * BLOCK_CHARS)  # 160 tokens: 10 full blocks
    body = {"model": MODEL, "prompt": prompt}
    with sim(profile, [MODEL]) as url:
        async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
            for _ in range(2):
                reply = await client.post("/v1/completions", json=body)
                assert reply.status_code == 200
            text = (await client.get("/metrics")).text
    queries = metric_value(text, "vllm:prefix_cache_queries_total", model_name=MODEL)
    hits = metric_value(text, "vllm:prefix_cache_hits_total", model_name=MODEL)
    # Two lookups of 160 tokens; the second finds 9 blocks (the 10th holds the last token).
    assert (queries, hits) == (320.0, 144.0)
