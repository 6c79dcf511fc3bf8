"""The fill bound (benchmarks/fairness/fill_bound.py), which steps the simulator's scheduler, on
hand-made profiles and schedules, each worked out step by step in the comments."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.fairness.fill_bound import Flood, Schedule, fifo, newcomer_ttft_steps, paced
from sim._profile import SimProfile

# Two slots, 100 tokens a step; a step costs 10 ms, 1 ms per decoding request, 0.1 ms per
# prompt token.
TINY = SimProfile(max_num_seqs=2, max_num_batched_tokens=100, step_base_ms=10.0,
                  step_per_seq_ms=1.0, prefill_ms_per_token=0.1)  # fmt: skip
FLOOD = Flood(requests=3, prompt_tokens=50, output_tokens=3)


def test_fifo_prefills_what_fits_and_waits_for_a_free_slot() -> None:
    # 1: two prompts prefilled (100 tokens), their first tokens: 10 + 10 = 20 ms.
    # 2, 3: both decode (12 ms each); they end after step 3. 4: the third prefilled alone
    # (10 + 5 = 15). 5, 6: it decodes alone (11 each).
    s = fifo(TINY, FLOOD)
    assert s.costs == pytest.approx([20, 12, 12, 15, 11, 11])
    assert s.running == [2, 2, 0, 1, 1, 0]


def test_fifo_splits_a_prompt_over_steps_within_the_token_budget() -> None:
    # 150-token prompts, 100 tokens a step. 1: the first gets 100 (20 ms). 2: its last 50
    # and the second's first 50 (20). 3: the first decodes, so the second gets 99 (10 + 1
    # + 9.9). 4: its last prompt token, which costs what a decode costs (11). 5: it
    # decodes (11). A request still prefilling is running (in the batch) already.
    s = fifo(TINY, Flood(requests=2, prompt_tokens=150, output_tokens=2))
    assert s.costs == pytest.approx([20, 20, 20.9, 11, 11])
    assert s.running == [1, 2, 1, 1, 0]


def test_paced_refills_drop_what_a_full_batch_refuses_instead_of_bursting() -> None:
    # One refill a step. 1: the first (15). 2: the second, beside one decoding (16).
    # 3: no free slot; that refill is dropped (12). 4: one, not two (16). 5, 6: 11 each.
    s = paced(TINY, FLOOD, rate=1.0, slots=2)
    assert s.costs == pytest.approx([15, 16, 12, 16, 11, 11])
    assert s.running == [1, 2, 1, 1, 1, 0]


def test_half_a_refill_a_step_sends_every_other_step() -> None:
    s = paced(TINY, Flood(requests=2, prompt_tokens=50, output_tokens=1), rate=0.5, slots=2)
    assert s.costs == pytest.approx([10, 15, 10, 15])  # a one-token answer ends at once


def test_a_newcomer_waits_out_the_step_in_progress_then_its_own() -> None:
    even = Schedule(costs=[10.0] * 40, running=[0] * 40, sent=[0] * 40)  # its own takes 10
    flat = SimProfile(step_base_ms=10.0, step_per_seq_ms=0.0, prefill_ms_per_token=0.0)
    at_once = newcomer_ttft_steps(flat, even, light_prompt_tokens=0, hop_ms=0.0)
    assert at_once[0] >= 1.0 and at_once[-1] <= 2.0  # the rest of a step, then one
    assert statistics.median(at_once) == pytest.approx(1.5, abs=0.05)
    # Reaching the engine a whole step later costs a whole step more.
    late = newcomer_ttft_steps(flat, even, light_prompt_tokens=0, hop_ms=10.0)
    assert statistics.median(late) == pytest.approx(2.5, abs=0.05)


def test_refills_that_reached_the_engine_first_share_an_unaligned_newcomers_step() -> None:
    # 10 ms steps, one 10-token refill sent for each (10 ms of prefill at 1 ms a token).
    # Aligned, each reaches the engine as its step begins: the newcomer's step holds none.
    # Unaligned, the refill of the newcomer's step reached the engine at a uniformly drawn
    # moment of the step in progress: before the newcomer as often as the share of that
    # step gone when the newcomer came. So the rest of a step (0.5 on average), its own (1)
    # and, that often, the refill's prefill (0.5 on average).
    paced_even = Schedule(costs=[10.0] * 40, running=[0] * 40, sent=[1] * 40)
    flat = SimProfile(step_base_ms=10.0, step_per_seq_ms=0.0, prefill_ms_per_token=1.0)
    aligned, unaligned = (
        newcomer_ttft_steps(flat, paced_even, 0, 0.0, aligned=a, prompt_tokens=10)
        for a in (True, False)
    )
    assert aligned[-1] <= 2.0
    assert statistics.mean(aligned) == pytest.approx(1.5, abs=0.05)
    assert statistics.mean(unaligned) == pytest.approx(2.0, abs=0.05)
    assert unaligned[-1] > 2.5  # late in a step and behind its refill
