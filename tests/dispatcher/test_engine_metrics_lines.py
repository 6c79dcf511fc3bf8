"""Reading only the lines admission needs from an engine's ``/metrics`` page
(``dispatcher.engine_metrics.wanted_lines``), on the real vLLM 0.32 captures and on
hand-made SGLang and TGI pages."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dispatcher.engine_metrics import (
    EngineSample,
    MetricsError,
    parse_metrics,
    parse_wanted,
    wanted_lines,
)
from tests.support.paths import FIXTURES

PAGES = {
    name: (FIXTURES / "vllm-0.32-cpu" / f"metrics_{name}.txt").read_bytes()
    for name in ("idle", "load", "load_big")
}


def sglang_page(model: str = "m") -> bytes:
    """An SGLang page as its collector (sgl-project/sglang python/sglang/srt/metrics/
    collector.py, commit 00ae9c15) exposes it through prometheus-client: the names, types
    and ``model_name`` label are its; the values are made up."""
    registry = CollectorRegistry()
    labels = {"model_name": model}
    for name, value in [
        ("sglang:num_running_reqs", 12),
        ("sglang:num_queue_reqs", 4),
        ("sglang:token_usage", 0.6),
        ("sglang:num_grammar_queue_reqs", 9),  # a look-alike queue: never read
        ("sglang:gen_throughput", 800.0),
    ]:
        Gauge(name, "", list(labels), registry=registry).labels(**labels).set(value)
    itl = Histogram("sglang:inter_token_latency_seconds", "", list(labels), registry=registry)
    for latency in (0.02, 0.03, 0.05):
        itl.labels(**labels).observe(latency)
    e2e = Histogram("sglang:e2e_request_latency_seconds", "", list(labels), registry=registry)
    e2e.labels(**labels).observe(4.0)
    tokens = Counter("sglang:generation_tokens", "", list(labels), registry=registry)
    tokens.labels(**labels).inc(500)
    return generate_latest(registry)


@pytest.mark.parametrize("name", sorted(PAGES))
@pytest.mark.parametrize("model", [None, "tiny"])
def test_the_wanted_lines_give_the_sample_the_whole_page_gives(
    name: str, model: str | None
) -> None:
    page = PAGES[name]
    assert parse_metrics(page, model) == parse_wanted(page, model)  # the whole page parsed


@pytest.mark.parametrize("name", sorted(PAGES))
def test_nearly_all_of_a_vllm_page_is_skipped(name: str) -> None:
    kept = wanted_lines(PAGES[name]).splitlines()
    assert 5 <= len(kept) <= 12 < len(PAGES[name].splitlines()) / 20
    assert not any(line.startswith(b"#") or b"_bucket" in line for line in kept)


def test_a_look_alike_name_is_not_a_wanted_line() -> None:
    page = b'vllm:num_requests_waiting_by_reason{reason="x"} 5\nvllm:num_requests_waiting 2\n'
    assert wanted_lines(page) == b"vllm:num_requests_waiting 2\n"


def test_the_first_line_and_a_last_line_without_a_newline_are_read() -> None:
    page = b"vllm:num_requests_waiting 2\nvllm:num_requests_running 3"
    assert parse_metrics(page) == EngineSample(2.0, 3.0, None, None, None)


def test_a_str_page_reads_as_its_bytes() -> None:
    assert parse_metrics(PAGES["load"].decode(), "tiny") == parse_metrics(PAGES["load"], "tiny")


def test_sglang_queue_running_token_usage_and_inter_token_latency() -> None:
    page = sglang_page()
    got = parse_metrics(page, "m")
    assert (got.waiting, got.running, got.kv_usage) == (4.0, 12.0, 0.6)
    assert (got.tpot_count, got.e2e_sum_s, got.e2e_count) == (3.0, 4.0, 1.0)
    assert got.tpot_sum_s == pytest.approx(0.10)
    assert got.generated is None and got.steps is None  # its token counter moves at the end
    assert got == parse_wanted(page, "m")
    assert b"grammar" not in wanted_lines(page)


def test_older_sglang_names_its_token_histogram_time_per_output_token() -> None:
    page = (
        b"sglang:num_queue_reqs 0\nsglang:num_running_reqs 2\n"
        b"sglang:time_per_output_token_seconds_sum 0.5\n"
        b"sglang:time_per_output_token_seconds_count 10\n"
    )
    assert parse_metrics(page) == EngineSample(0.0, 2.0, None, 0.5, 10.0)


def test_tgi_lines_are_read_without_labels() -> None:
    page = (
        b"# TYPE tgi_queue_size gauge\ntgi_queue_size 3\ntgi_queue_size_limit 99\n"
        b"tgi_batch_current_size 5\ntgi_batch_current_max_tokens 2048\n"
        b"tgi_request_mean_time_per_token_duration_sum 0.64\n"
        b"tgi_request_mean_time_per_token_duration_count 32\n"
    )
    assert parse_metrics(page) == EngineSample(3.0, 5.0, None, 0.64, 32.0)


def test_a_stray_line_admission_does_not_read_is_not_read() -> None:
    # The scraper refuses a page whose content type is not Prometheus text; inside one, a
    # line of another metric costs nothing, broken or not.
    page = PAGES["load"] + b"$ curl http://engine:8000/metrics\n<p>hi</p>\n"
    assert parse_metrics(page, "tiny") == parse_metrics(PAGES["load"], "tiny")


@pytest.mark.parametrize(
    "line",
    [b"vllm:num_requests_waiting eight", b'vllm:num_requests_running{engine="0" 1'],
)
def test_a_page_whose_wanted_line_is_not_exposition_is_refused(line: bytes) -> None:
    with pytest.raises(MetricsError, match="not Prometheus"):
        parse_metrics(PAGES["load"] + line + b"\n")
