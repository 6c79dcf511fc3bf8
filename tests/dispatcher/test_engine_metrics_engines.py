"""Each engine's ``/metrics`` as that engine writes it (``tests/fixtures``: vLLM captured,
SGLang, TGI and llama.cpp built from their own sources and docs; the README says where
from) read by ``dispatcher.engine_metrics``: the queue, the batch, KV use and the time per
token where the engine has them, None where it has not, and never one engine's page read
as another's."""

from __future__ import annotations

import pytest

from dispatcher.capacity import Capacity
from dispatcher.engine_metrics import (
    EngineSample,
    engine_drain_per_s,
    parse_metrics,
    parse_wanted,
    recent_tpot_s,
    wanted_lines,
)
from tests.support.paths import FIXTURES


def page(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


# fixture -> the engine whose names it uses, and the prefix of every line admission reads
PAGES = {
    "vllm-0.32-cpu/metrics_load.txt": ("vllm", b"vllm:"),
    "sglang-00ae9c15/metrics_busy.txt": ("sglang", b"sglang:"),
    "sglang-00ae9c15/metrics_all_schedulers_tp2.txt": ("sglang", b"sglang:"),
    "sglang-docs/metrics_excerpt.txt": ("sglang", b"sglang:"),
    "tgi-db931fcf/metrics_busy.txt": ("tgi", b"tgi_"),
    "llamacpp-fb402660/metrics_idle.txt": ("llamacpp", b"llamacpp:"),
    "llamacpp-fb402660/metrics_busy.txt": ("llamacpp", b"llamacpp:"),
    "llamacpp-61e588ab/metrics_busy.txt": ("llamacpp", b"llamacpp:"),
}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_page_is_read_as_its_own_engines_and_by_its_own_lines_only(name: str) -> None:
    engine, prefix = PAGES[name]
    text = page(name)
    assert parse_metrics(text).engine == engine
    kept = wanted_lines(text).splitlines()
    assert kept and all(line.startswith(prefix) for line in kept)
    assert parse_wanted(text) == parse_metrics(text)  # the lines kept say all the page says


def test_one_engines_page_has_none_of_the_other_engines_lines() -> None:
    # A page read as another engine's would need that engine's queue gauge in it.
    for name, (engine, _) in PAGES.items():
        others = {prefix for other, prefix in PAGES.values() if other != engine}
        assert not any(line.startswith(tuple(others)) for line in page(name).splitlines())


# --- llama.cpp ---


def test_llamacpp_deferred_requests_wait_and_processing_slots_run() -> None:
    got = parse_metrics(page("llamacpp-fb402660/metrics_busy.txt"))
    assert (got.waiting, got.running) == (3.0, 4.0)
    assert got.kv_usage is None  # current builds have no KV gauge
    assert got.steps == 5012.0  # llama_decode() calls
    assert got.generated is None  # its token counter moves only when a request ends
    assert (got.tpot_sum_s, got.tpot_count) == (1031.46, 18822.0)
    assert (got.e2e_sum_s, got.e2e_count) == (None, None)
    assert engine_drain_per_s(got) is None  # no end-to-end latency: no drain estimate


def test_llamacpp_time_per_token_is_the_generation_time_of_the_requests_ended_between() -> None:
    before = parse_metrics(page("llamacpp-fb402660/metrics_busy.txt"))
    after = parse_metrics(page("llamacpp-fb402660/metrics_busy_later.txt"))
    assert recent_tpot_s(before, after) == pytest.approx(28.16 / 512)
    assert after.steps is not None and before.steps is not None
    assert after.steps - before.steps == 128
    assert recent_tpot_s(after, after) is None  # no request ended: nothing to say


def test_an_idle_llamacpp_reads_as_an_empty_engine() -> None:
    got = parse_metrics(page("llamacpp-fb402660/metrics_idle.txt"))
    assert got == EngineSample(0.0, 0.0, None, 0.0, 0.0, steps=0.0)


def test_an_older_llamacpp_also_gives_its_kv_cache_usage() -> None:
    got = parse_metrics(page("llamacpp-61e588ab/metrics_busy.txt"))
    assert (got.waiting, got.running, got.kv_usage) == (5.0, 4.0, 0.934082)
    assert (got.steps, got.tpot_count) == (2207.0, 7745.0)


# --- SGLang ---


def test_sglang_queue_running_token_usage_and_inter_token_latency() -> None:
    got = parse_metrics(page("sglang-00ae9c15/metrics_busy.txt"), "qwen")
    assert (got.waiting, got.running, got.kv_usage) == (17.0, 48.0, 0.87)
    assert (got.tpot_sum_s, got.tpot_count) == (5742.31, 201766.0)
    e2e_s = 1100 * 8.2 + 103 * 31.0
    assert got.e2e_count == 1203.0 and got.e2e_sum_s == pytest.approx(e2e_s)
    assert got.steps == 48210 + 312  # forward passes, with CUDA graphs or not
    assert got.generated is None
    assert engine_drain_per_s(got) == pytest.approx(65 / (e2e_s / 1203))


def test_sglang_grammar_queue_is_not_the_waiting_queue() -> None:
    assert b"grammar" not in wanted_lines(page("sglang-00ae9c15/metrics_busy.txt"))


def test_sglang_ranks_exporting_one_engines_queue_count_it_once() -> None:
    one = parse_metrics(page("sglang-00ae9c15/metrics_busy.txt"))
    every_rank = parse_metrics(page("sglang-00ae9c15/metrics_all_schedulers_tp2.txt"))
    assert (every_rank.waiting, every_rank.running) == (one.waiting, one.running) == (17, 48)
    assert every_rank.steps == one.steps  # each rank counts the same passes


def test_sglang_data_parallel_ranks_are_separate_queues_and_add_up() -> None:
    text = (
        b'sglang:num_queue_reqs{dp_rank="0",model_name="m",tp_rank="0"} 2.0\n'
        b'sglang:num_queue_reqs{dp_rank="0",model_name="m",tp_rank="1"} 2.0\n'
        b'sglang:num_queue_reqs{dp_rank="1",model_name="m",tp_rank="0"} 5.0\n'
        b'sglang:num_running_reqs{dp_rank="0",model_name="m",tp_rank="0"} 8.0\n'
        b'sglang:num_running_reqs{dp_rank="1",model_name="m",tp_rank="0"} 7.0\n'
    )
    assert (parse_metrics(text).waiting, parse_metrics(text).running) == (7.0, 15.0)


def test_a_nan_from_one_rank_is_refused_not_hidden_by_its_copy() -> None:
    text = (
        b'sglang:num_queue_reqs{model_name="m",tp_rank="0"} 2.0\n'
        b'sglang:num_queue_reqs{model_name="m",tp_rank="1"} NaN\n'
        b'sglang:num_running_reqs{model_name="m",tp_rank="0"} 1.0\n'
    )
    with pytest.raises(ValueError, match="not a count"):
        parse_metrics(text)


def test_sglangs_documented_page_reads_with_its_older_token_histogram() -> None:
    got = parse_metrics(page("sglang-docs/metrics_excerpt.txt"))
    assert (got.waiting, got.running, got.kv_usage) == (2826.0, 162.0, 0.28)
    assert (got.tpot_sum_s, got.tpot_count) == (866964.5791549598, 7.400757e06)
    assert (got.e2e_sum_s, got.e2e_count) == (3.116093850019932e06, 11228.0)


def test_sglangs_first_queue_gauge_names_are_read_too() -> None:
    # python/sglang/srt/metrics/metrics_collector.py at 029316b8: label names as there
    text = (
        b"# TYPE sglang:num_requests_running gauge\n"
        b'sglang:num_requests_running{name="qwen"} 6.0\n'
        b"# TYPE sglang:num_requests_waiting gauge\n"
        b'sglang:num_requests_waiting{name="qwen"} 2.0\n'
        b'sglang:token_usage{name="qwen"} 0.5\n'
    )
    got = parse_metrics(text)
    assert (got.engine, got.waiting, got.running, got.kv_usage) == ("sglang", 2.0, 6.0, 0.5)


# --- TGI ---


def test_tgi_queue_batch_and_mean_time_per_token_without_kv_usage() -> None:
    got = parse_metrics(page("tgi-db931fcf/metrics_busy.txt"))
    assert (got.waiting, got.running, got.kv_usage) == (12.0, 32.0, None)
    assert got.tpot_count == 1287.0
    assert got.tpot_sum_s == pytest.approx(700 * 0.021 + 587 * 0.034)
    assert got.e2e_count == 1287.0 and got.generated is None
    assert got.steps == 905 + 61230  # forward passes of its batch, prefill and decode


def test_tgi_learns_its_batch_from_its_forward_passes() -> None:
    earlier = parse_metrics(page("tgi-db931fcf/metrics_busy.txt"))
    text = page("tgi-db931fcf/metrics_busy.txt").replace(
        b'tgi_batch_inference_count{method="decode"} 61230',
        b'tgi_batch_inference_count{method="decode"} 61250',
    )
    later = parse_metrics(text)
    assert Capacity().learn(earlier, later).slots == 32  # requests waited through 20 steps
