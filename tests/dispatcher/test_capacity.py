"""An engine's capacity learned from two scrapes (``dispatcher.capacity``), on hand-made
samples."""

from __future__ import annotations

from dispatcher.capacity import CONFIRM_MIN_S, Capacity, confirm_delay_s
from dispatcher.engine_metrics import EngineSample


def _sample(waiting: float, running: float, steps: float | None = 0.0) -> EngineSample:
    return EngineSample(waiting, running, None, None, None, steps=steps)


def _learned(*samples: EngineSample, starting: int = 0) -> Capacity:
    capacity, previous = Capacity(), None
    for sample in samples:
        capacity, previous = capacity.learn(previous, sample, starting), sample
    return capacity


def test_the_batch_is_learned_when_requests_waited_through_engine_steps_at_a_flat_batch() -> None:
    assert _learned(_sample(3, 32)).slots == 0  # one scrape says nothing
    assert _learned(_sample(3, 24, 0), _sample(3, 32, 9)).slots == 0  # growing
    assert _learned(_sample(3, 32, 0), _sample(2, 32, 9)).slots == 32  # full
    full = _learned(_sample(3, 32, 0), _sample(2, 32, 9))
    assert (full.slots, full.full_at) == (32, 32)


def test_requests_that_wait_only_for_the_next_step_to_take_them_in_show_no_full_engine() -> None:
    # A flood refilled as its answers end: at every scrape two of fairq's refills, handed
    # over within the last steps, wait for the step that takes them in, at a flat running
    # set -- a batch of 113 that is not full (its engine runs 256).
    # Each such read asks for another a few steps later: whether they waited only for a
    # step shows then.
    refilled = _learned(_sample(2, 113, 0), _sample(2, 113, 9), _sample(2, 113, 18), starting=2)
    assert (refilled.slots, refilled.full_at, refilled.confirm) == (0, None, True)
    # One request more than those waiting is waiting for room.
    full = _learned(_sample(3, 113, 0), _sample(3, 113, 9), starting=2)
    assert (full.slots, full.full_at) == (113, 113)


def test_a_batch_seen_full_stays_while_nothing_waits_and_rises_with_a_larger_running_set() -> None:
    learned = _learned(_sample(3, 32, 0), _sample(2, 32, 9), _sample(0, 20, 18))
    assert (learned.slots, learned.full_at) == (32, None)
    assert _learned(_sample(3, 32, 0), _sample(2, 32, 9), _sample(0, 40, 18)).slots == 40


def test_a_running_set_full_below_the_slots_is_the_kv_bound_not_a_smaller_batch() -> None:
    learned = _learned(_sample(3, 32, 0), _sample(2, 32, 9), _sample(1, 30, 18), _sample(1, 30, 27))
    assert (learned.slots, learned.full_at) == (32, 30)


def test_waiting_through_one_long_prefill_step_teaches_nothing() -> None:
    # Three requests prefilling a long prompt in one step, three more waiting for it to end.
    assert _learned(_sample(3, 3, 10), _sample(3, 3, 11)).slots == 0


def test_without_a_step_counter_output_tokens_tell_the_steps() -> None:
    before = EngineSample(2, 8, None, None, None, generated=100)
    one_step = EngineSample(2, 8, None, None, None, generated=108)
    many = EngineSample(2, 8, None, None, None, generated=180)
    assert _learned(before, one_step).slots == 0
    assert _learned(before, many).slots == 8


def test_an_engine_restarted_with_a_smaller_batch_is_learned_afresh() -> None:
    # 16 slots seen full; the engine comes back (its step counter from zero) with 4.
    learned = _learned(_sample(3, 16, 500), _sample(3, 16, 600))
    assert learned.slots == 16
    after = _learned(_sample(3, 16, 500), _sample(3, 16, 600), _sample(2, 4, 5), _sample(2, 4, 9))
    assert (after.slots, after.full_at) == (4, 4)


def test_requests_that_begin_to_wait_at_an_unknown_running_set_ask_for_a_second_read() -> None:
    assert _learned(_sample(0, 2), _sample(3, 4)).confirm  # began to wait, batch unknown
    assert not _learned(_sample(3, 4, 0), _sample(3, 4, 9)).confirm  # known full: no need
    # Nothing waits: a second read only at a running set larger than any before (a ramp
    # whose next sends may fill it), while the capacity is unknown.
    assert _learned(_sample(0, 4)).confirm
    assert not _learned(_sample(0, 4), _sample(0, 4)).confirm
    assert not _learned(_sample(0, 6), _sample(0, 4)).confirm
    assert not _learned(_sample(3, 4, 0), _sample(3, 4, 9), _sample(0, 5, 18)).confirm  # known
    # Known full at 4, requests wait again at 4 after a pause: nothing new to tell.
    again = _learned(_sample(3, 4, 0), _sample(3, 4, 9), _sample(0, 4, 18), _sample(1, 4, 27))
    assert not again.confirm
    # ... but waiting at 3 (its KV cache, perhaps) is news.
    kv = _learned(_sample(3, 4, 0), _sample(3, 4, 9), _sample(0, 4, 18), _sample(1, 3, 27))
    assert kv.confirm


def test_a_confirming_read_that_cannot_tell_asks_for_another() -> None:
    # A flood's ramp: the confirming read finds a larger running set.
    assert _learned(_sample(0, 0, 0), _sample(3, 8, 1), _sample(3, 16, 3)).confirm
    # Not where the engine's counters stand still: it would be read every few steps.
    assert not _learned(_sample(0, 0, 0), _sample(3, 16, 1), _sample(3, 16, 1)).confirm
    # The next one tells.
    told = _learned(_sample(0, 0, 0), _sample(3, 8, 1), _sample(3, 16, 3), _sample(3, 16, 9))
    assert (told.slots, told.confirm) == (16, False)


def test_the_confirming_read_comes_a_few_steps_later_and_never_at_once() -> None:
    assert confirm_delay_s(None) == CONFIRM_MIN_S
    assert confirm_delay_s(0.001) == CONFIRM_MIN_S
    assert confirm_delay_s(0.05) > 0.1


def test_an_override_the_engine_disagrees_with_is_named() -> None:
    full_at_4 = _learned(_sample(3, 4, 0), _sample(3, 4, 9))
    assert full_at_4.disagrees(16) == "the engine was full at 4 requests, fewer than batch_slots"
    assert full_at_4.disagrees(4) is None and full_at_4.disagrees(None) is None
    # Seen full below batch_slots with most of its KV cache free: it waited for a prefill
    # budget, not room; nothing to say.
    busy = [EngineSample(w, 4, 0.2, None, None, steps=n) for w, n in ((3, 0), (3, 9))]
    assert _learned(*busy).disagrees(16) is None
    ran_9 = _learned(_sample(0, 9))
    assert ran_9.disagrees(8) == "the engine ran 9 requests at once, more than batch_slots"
    assert ran_9.disagrees(0) is None  # the batch rule off: nothing to disagree with
