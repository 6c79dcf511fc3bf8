"""Engine metrics: the pure parser on real captures, the scraper against real HTTP servers.

Parser tests read the real vLLM 0.32 captures and the vLLM docs excerpts in
``tests/fixtures``; multi-series texts are rendered by prometheus_client, the
library vLLM itself exposes its metrics with. Scraper tests run a tiny ASGI
app under a real uvicorn on 127.0.0.1 whose answer each test switches (good
text, 500, an HTML page, hang); nothing in the HTTP client is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from broker import Unseen
from dispatcher.engine_metrics import (
    EngineSample,
    MetricsError,
    engine_drain_per_s,
    parse_metrics,
    recent_tpot_s,
)
from dispatcher.scraper import Scraper
from fairq.stack.localredis import free_port
from tests.support.eventually import aeventually
from tests.support.paths import FIXTURES
from tests.support.servers import uvicorn_thread

IDLE = (FIXTURES / "vllm-0.32-cpu" / "metrics_idle.txt").read_text()
LOAD = (FIXTURES / "vllm-0.32-cpu" / "metrics_load.txt").read_text()
LOAD_BIG = (FIXTURES / "vllm-0.32-cpu" / "metrics_load_big.txt").read_text()
DOCS = (FIXTURES / "vllm-docs" / "metrics_excerpts.txt").read_text()
DEADLINE_S = 5.0

# TGI's names and types from huggingface/text-generation-inference
# docs/source/reference/metrics.md (commit 53fdbe61); the layout is what its
# exporter (the Rust metrics-exporter-prometheus crate) writes: no HELP lines, a
# `# TYPE` per family, unlabelled gauges, `method`-labelled batch metrics, and
# histograms for every `*duration` metric (router/src/server.rs sets their buckets).
# No verbatim TGI scrape exists in the fixtures, so this one is written by hand.
TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 3
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 5
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 2048
# TYPE tgi_request_count counter
tgi_request_count 40
# TYPE tgi_batch_forward_duration histogram
tgi_batch_forward_duration_bucket{method="decode",le="0.00015"} 0
tgi_batch_forward_duration_bucket{method="decode",le="+Inf"} 310
tgi_batch_forward_duration_sum{method="decode"} 6.2
tgi_batch_forward_duration_count{method="decode"} 310
# TYPE tgi_request_mean_time_per_token_duration histogram
tgi_request_mean_time_per_token_duration_bucket{le="0.00015"} 0
tgi_request_mean_time_per_token_duration_bucket{le="0.0256"} 30
tgi_request_mean_time_per_token_duration_bucket{le="+Inf"} 32
tgi_request_mean_time_per_token_duration_sum 0.64
tgi_request_mean_time_per_token_duration_count 32
"""


def docs_source_a() -> str:
    """The exposition lines of SOURCE A in the vLLM docs excerpts (V0, model_name only)."""
    block = DOCS.split("### SOURCE A")[1].split("### SOURCE B")[0]
    lines = [ln for ln in block.splitlines() if ln.startswith(("# HELP", "# TYPE", "vllm:"))]
    return "\n".join(lines) + "\n"


def vllm_text(series: Sequence[tuple[str, str, float, float, float, Sequence[float]]]) -> str:
    """vLLM V1 exposition for (engine, model, waiting, running, kv_usage, token latencies)."""
    registry = CollectorRegistry()
    labels = ["engine", "model_name"]
    waiting = Gauge("vllm:num_requests_waiting", "w", labels, registry=registry)
    running = Gauge("vllm:num_requests_running", "r", labels, registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", labels, registry=registry)
    itl = Histogram("vllm:inter_token_latency_seconds", "itl", labels, registry=registry)
    for engine, model, n_waiting, n_running, usage, latencies in series:
        waiting.labels(engine, model).set(n_waiting)
        running.labels(engine, model).set(n_running)
        kv.labels(engine, model).set(usage)
        for latency in latencies:
            itl.labels(engine, model).observe(latency)
    return generate_latest(registry).decode()


def sample(tpot_sum_s: float | None, tpot_count: float | None) -> EngineSample:
    return EngineSample(0, 0, None, tpot_sum_s, tpot_count)


# --- parse_metrics on real captures ---------------------------------------------------


def test_idle_capture_reads_as_an_empty_engine() -> None:
    idle = EngineSample(
        0.0, 0.0, 0.0, 0.0, 0.0, steps=0.0, generated=0.0, e2e_sum_s=0.0, e2e_count=0.0
    )
    assert parse_metrics(IDLE) == idle
    assert engine_drain_per_s(parse_metrics(IDLE)) is None  # nothing in it to drain


def test_load_capture_reads_32_running_8_waiting_and_its_inter_token_histogram() -> None:
    # 8 also proves num_requests_waiting_by_reason (8 + 0) is not added in, and
    # count 77 that the per-request TPOT histogram (count 2) is not taken instead.
    got = parse_metrics(LOAD, "tiny")
    assert (got.waiting, got.running) == (8.0, 32.0)
    assert got.kv_usage == 0.0039067268953729695
    assert (got.tpot_sum_s, got.tpot_count) == (0.6917757930001471, 77.0)


def test_big_load_capture_reads_168_waiting() -> None:
    got = parse_metrics(LOAD_BIG)
    assert (got.waiting, got.running, got.kv_usage) == (168.0, 32.0, 0.007813453790745939)
    assert (got.tpot_sum_s, got.tpot_count) == (33.42936768700167, 3771.0)


def test_docs_excerpt_without_a_waiting_gauge_is_rejected() -> None:
    # The docs' own example shows only the running gauge: not enough to admit on.
    with pytest.raises(MetricsError, match="num_requests_waiting"):
        parse_metrics(docs_source_a())


def test_older_vllm_names_give_kv_usage_and_time_per_output_token() -> None:
    # The docs' real V0 lines plus the V0 gauges and histogram the excerpt elides,
    # named and labelled as vllm/engine/metrics.py (commit 00c33e81) defines them.
    model = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    text = docs_source_a() + (
        f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{model}}} 2.0\n"
        f"# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{{{model}}} 0.25\n"
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        f'vllm:time_per_output_token_seconds_bucket{{le="+Inf",{model}}} 400.0\n'
        f"vllm:time_per_output_token_seconds_count{{{model}}} 400.0\n"
        f"vllm:time_per_output_token_seconds_sum{{{model}}} 12.0\n"
    )
    got = parse_metrics(text, "meta-llama/Llama-3.1-8B-Instruct")
    assert got == EngineSample(2.0, 8.0, 0.25, 12.0, 400.0, generated=27453.0)


def test_current_names_win_over_older_ones_when_both_are_exposed() -> None:
    text = LOAD + (
        '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="tiny"} 0.9\n'
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        'vllm:time_per_output_token_seconds_count{model_name="tiny"} 5.0\n'
        'vllm:time_per_output_token_seconds_sum{model_name="tiny"} 9.0\n'
    )
    got = parse_metrics(text)
    assert (got.kv_usage, got.tpot_count) == (0.0039067268953729695, 77.0)


def test_tgi_queue_batch_and_mean_time_per_token_without_kv_usage() -> None:
    assert parse_metrics(TGI) == EngineSample(3.0, 5.0, None, 0.64, 32.0)
    with_duration = TGI + (
        "# TYPE tgi_request_duration histogram\n"
        'tgi_request_duration_bucket{le="+Inf"} 32\n'
        "tgi_request_duration_sum 64.0\ntgi_request_duration_count 32\n"
    )
    got = parse_metrics(with_duration)
    assert (got.e2e_sum_s, got.e2e_count) == (64.0, 32.0)
    assert engine_drain_per_s(got) == pytest.approx((3 + 5) / 2.0)


# --- series selection ------------------------------------------------------------------


def test_data_parallel_engine_series_are_summed_and_kv_is_the_fullest() -> None:
    text = vllm_text([("0", "m", 3, 10, 0.2, [0.01, 0.03]), ("1", "m", 5, 12, 0.7, [0.02])])
    got = parse_metrics(text, "m")
    assert (got.waiting, got.running, got.kv_usage, got.tpot_count) == (8.0, 22.0, 0.7, 3.0)
    assert got.tpot_sum_s == pytest.approx(0.06)


def test_model_name_keeps_only_that_models_series() -> None:
    text = vllm_text([("0", "a", 1, 4, 0.1, [0.5]), ("0", "b", 6, 9, 0.3, [0.1, 0.1])])
    assert parse_metrics(text, "a") == EngineSample(1.0, 4.0, 0.1, 0.5, 1.0)
    assert parse_metrics(text, "b").waiting == 6.0
    assert parse_metrics(text).waiting == 7.0


def test_model_name_without_series_is_an_error_not_an_empty_queue() -> None:
    with pytest.raises(MetricsError, match="model_name='other'"):
        parse_metrics(LOAD, "other")


# --- rejected text ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "hello world",
        "<html><body><h1>502 Bad Gateway</h1></body></html>",
        '{"error": "not found"}',
        DOCS,  # commentary around the samples, and no waiting gauge
    ],
    ids=["words", "html", "json", "annotated-docs"],
)
def test_text_that_is_not_an_engines_exposition_raises_metrics_error(text: str) -> None:
    # Lines admission does not read are not read: such a page fails for lacking the gauges.
    with pytest.raises(MetricsError, match=r"no engine queue gauge|num_requests_waiting"):
        parse_metrics(text)


@pytest.mark.parametrize(
    "line",
    [
        b'vllm:num_requests_waiting{engine="0" 8.0',
        b"vllm:num_requests_waiting eight",
        b"vllm:num_requests_waiting \xff",
    ],
    ids=["broken-labels", "a-word-for-a-value", "not-utf-8"],
)
def test_a_wanted_line_that_is_not_exposition_raises_metrics_error(line: bytes) -> None:
    with pytest.raises(MetricsError, match="not Prometheus"):
        parse_metrics(IDLE.encode() + line + b"\n")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n".join(ln for ln in IDLE.splitlines() if not ln.startswith(("vllm:", "# HELP vllm:"))),
        LOAD.replace("vllm:num_requests_running{", "vllm:num_requests_runnin{"),
    ],
    ids=["empty", "python-process-metrics-only", "no-running-gauge"],
)
def test_text_without_the_queue_gauges_raises_metrics_error(text: str) -> None:
    with pytest.raises(MetricsError):
        parse_metrics(text)


def test_a_nan_queue_gauge_is_rejected() -> None:
    with pytest.raises(MetricsError, match="not a count"):
        parse_metrics(LOAD.replace('model_name="tiny"} 8.0', 'model_name="tiny"} NaN'))


def test_metrics_error_is_a_value_error() -> None:
    assert issubclass(MetricsError, ValueError)


# --- engine_drain_per_s ------------------------------------------------------------------


def _engine(running: float, waiting: float, e2e: tuple[float, float] | None, itl_sum_s: float
            ) -> EngineSample:  # fmt: skip
    e2e_sum_s, e2e_count = e2e if e2e is not None else (None, None)
    return EngineSample(waiting, running, None, itl_sum_s, 1.0, e2e_sum_s=e2e_sum_s,
                        e2e_count=e2e_count)  # fmt: skip


def test_the_engines_drain_is_the_requests_in_it_over_their_mean_end_to_end_time() -> None:
    # 30 running + 10 waiting, requests took 20 s each on average: 2 end per second
    assert engine_drain_per_s(_engine(30, 10, (400.0, 20), 99.0)) == pytest.approx(2.0)
    # the real capture: 32 running, 8 waiting, 2 requests ended in 0.135 s together
    got = engine_drain_per_s(parse_metrics(LOAD, "tiny"))
    assert got == pytest.approx(40 / (0.13484835624694824 / 2))


def test_before_any_request_ended_the_drain_is_bounded_by_the_decode_time_so_far() -> None:
    # 32 running for 2 s of decode each (64 s of token intervals), none done: each takes
    # 2 s at least, so at most 32 end in 2 s. The longer none ends, the slower.
    assert engine_drain_per_s(_engine(32, 8, (0.0, 0), 64.0)) == pytest.approx(16.0)
    assert engine_drain_per_s(_engine(32, 8, (0.0, 0), 640.0)) == pytest.approx(1.6)


@pytest.mark.parametrize(
    "engine",
    [
        _engine(0, 0, (400.0, 20), 99.0),  # nothing in the engine
        _engine(32, 0, None, 64.0),  # no end-to-end histogram: nothing says how long
        _engine(0, 5, (0.0, 0), 0.0),  # nothing ended, nothing runs yet
        _engine(32, 0, (0.0, 0), 0.0),  # nothing ended, no token yet
    ],
    ids=["empty", "no-histogram", "none-running", "no-token-yet"],
)
def test_the_engines_drain_is_none_when_nothing_tells_it(engine: EngineSample) -> None:
    assert engine_drain_per_s(engine) is None


# --- recent_tpot_s ---------------------------------------------------------------------


def test_tpot_is_the_mean_latency_of_the_tokens_between_two_scrapes() -> None:
    assert recent_tpot_s(sample(1.0, 100), sample(3.0, 150)) == pytest.approx(0.04)


def test_tpot_between_the_real_load_captures() -> None:
    got = recent_tpot_s(parse_metrics(LOAD), parse_metrics(LOAD_BIG))
    assert got == pytest.approx((33.42936768700167 - 0.6917757930001471) / (3771 - 77))


@pytest.mark.parametrize(
    ("previous", "current"),
    [
        (sample(3.0, 150), sample(3.0, 150)),  # no token in between
        (sample(3.0, 150), sample(0.2, 10)),  # counters went back: the engine restarted
        (sample(3.0, 150), sample(0.2, 160)),  # sum went back although count grew
        (None, sample(3.0, 150)),  # first scrape
        (sample(None, None), sample(3.0, 150)),  # no histogram before
        (sample(3.0, 150), sample(None, None)),  # no histogram now
    ],
    ids=["no-new-tokens", "counter-reset", "sum-reset", "no-previous", "none-before", "none-now"],
)
def test_tpot_is_none_without_new_tokens_to_measure(
    previous: EngineSample | None, current: EngineSample
) -> None:
    assert recent_tpot_s(previous, current) is None


# --- the scraper against real HTTP servers ------------------------------------------


class FakeEngine:
    """A /metrics endpoint whose answer the test switches: ok, error, garbage or hang."""

    def __init__(self, text: str = IDLE) -> None:
        self.text = text
        self.mode = "ok"
        self.delay_s = 0.0
        self.delays: list[float] = []  # per coming request, before delay_s applies again
        self.arrivals: list[float] = []  # time.monotonic() as each request came in
        self.closing = False

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        self.arrivals.append(time.monotonic())
        await asyncio.sleep(self.delays.pop(0) if self.delays else self.delay_s)
        while self.mode == "hang" and not self.closing:
            await asyncio.sleep(0.01)
        status, body = {
            "error": (500, b"Internal Server Error"),
            "garbage": (200, b"<html>it works</html>"),
        }.get(self.mode, (200, self.text.encode()))
        kind = b"text/html" if self.mode == "garbage" else b"text/plain; version=0.0.4"
        headers = [(b"content-type", kind + b"; charset=utf-8")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving(engine: FakeEngine) -> Iterator[str]:
    """``engine`` under a real uvicorn in a thread; yields its base URL."""
    with uvicorn_thread(engine, lifespan="off") as url:
        try:
            yield url
        finally:
            engine.closing = True  # releases hung requests, so shutdown does not wait on them


@pytest.fixture
def engine() -> Iterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    with serving(fake) as url:
        yield fake, url


@pytest.fixture
def other_engine() -> Iterator[tuple[FakeEngine, str]]:
    fake = FakeEngine()
    with serving(fake) as url:
        yield fake, url


@pytest.fixture
async def make_scraper() -> AsyncIterator[Callable[..., Scraper]]:
    """``Scraper(...)``, closed (its connections) when the test ends."""
    made: list[Scraper] = []

    def make(*args: Any, **kwargs: Any) -> Scraper:
        made.append(Scraper(*args, **kwargs))
        return made[-1]

    yield make
    for scraper in made:
        scraper.close()


@contextlib.asynccontextmanager
async def running(scraper: Scraper) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(scraper.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # free_port never hands it out again


async def test_a_good_endpoints_view_follows_its_metrics_within_a_few_intervals(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    fake, url = engine
    scraper = make_scraper([url], interval_s=0.05)
    assert scraper.view(url).sample is None and not scraper.view(url).healthy
    async with running(scraper):
        await aeventually(
            lambda: scraper.view(url).sample is not None, "a first sample", DEADLINE_S
        )
        assert scraper.view(url).sample == parse_metrics(IDLE)
        fake.text = LOAD
        await aeventually(
            lambda: (s := scraper.view(url).sample) is not None and s.waiting == 8,
            "a sample of 8 waiting",
            DEADLINE_S,
        )
    view = scraper.view(url)
    assert view.healthy and view.failures == 0 and view.error is None


async def test_tpot_comes_from_the_last_two_good_scrapes(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    fake, url = engine
    scraper = make_scraper([url])
    fake.text = LOAD
    await scraper.scrape_once()
    assert scraper.view(url).tpot_s is None  # one scrape: nothing to compare with
    fake.text = LOAD_BIG
    await scraper.scrape_once()
    tpot = scraper.view(url).tpot_s
    assert tpot == pytest.approx((33.42936768700167 - 0.6917757930001471) / (3771 - 77))
    await scraper.scrape_once()
    assert scraper.view(url).tpot_s is None  # no token since the previous scrape


async def test_a_failing_endpoint_turns_unhealthy_after_n_failures_and_back_on_success(
    engine: tuple[FakeEngine, str],
    caplog: pytest.LogCaptureFixture,
    make_scraper: Callable[..., Scraper],
) -> None:
    fake, url = engine
    scraper = make_scraper([url], unhealthy_after=2)
    caplog.set_level(logging.INFO, logger="dispatcher.scraper")
    await scraper.scrape_once()
    good = scraper.view(url).sample
    assert scraper.view(url).healthy and good is not None

    fake.mode = "error"
    await scraper.scrape_once()
    view = scraper.view(url)
    assert (view.healthy, view.failures, view.error) == (True, 1, "HTTP 500")
    assert not caplog.records  # one failure: not worth a log line above DEBUG
    fake.mode = "garbage"
    await scraper.scrape_once()
    assert (scraper.view(url).healthy, scraper.view(url).failures) == (False, 2)
    await scraper.scrape_once()
    view = scraper.view(url)
    assert (view.healthy, view.failures, view.sample) == (False, 3, good)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]  # on the transition only

    fake.mode = "ok"
    await scraper.scrape_once()
    view = scraper.view(url)
    assert (view.healthy, view.failures, view.error) == (True, 0, None)
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("error", "HTTP 500"),
        ("garbage", "not Prometheus"),
        ("not-an-engine", "no engine queue gauge"),
        ("hang", "no answer within 0.3 s"),
        ("refused", "cannot connect"),
    ],
)
async def test_every_kind_of_failure_counts_and_is_explained(
    engine: tuple[FakeEngine, str], mode: str, reason: str, make_scraper: Callable[..., Scraper]
) -> None:
    fake, url = engine
    fake.mode = mode
    fake.text = "# TYPE up gauge\nup 1\n"  # for not-an-engine: valid text, no queue gauge
    url = closed_port_url() if mode == "refused" else url
    scraper = make_scraper([url], timeout_s=0.3, unhealthy_after=1)
    started = time.monotonic()
    await scraper.scrape_once()
    assert time.monotonic() - started < 0.3 + 1.0  # a hang ends at the timeout
    view = scraper.view(url)
    assert (view.healthy, view.failures, view.sample) == (False, 1, None)
    assert view.error is not None and reason in view.error


async def test_a_hanging_endpoint_does_not_delay_the_others_scrapes(
    engine: tuple[FakeEngine, str],
    other_engine: tuple[FakeEngine, str],
    make_scraper: Callable[..., Scraper],
) -> None:
    (_, good), (stuck, hanging) = engine, other_engine
    stuck.mode = "hang"
    updates: dict[str, list[float]] = {good: [], hanging: []}
    scraper = make_scraper(
        [good, hanging],
        interval_s=0.05,
        timeout_s=0.4,
        on_update=lambda e: updates[e].append(time.monotonic()),
    )
    async with running(scraper) as task:
        await aeventually(lambda: scraper.view(hanging).failures >= 2, "two timeouts", DEADLINE_S)
        assert not task.done()  # failures never end run()
    assert not scraper.view(hanging).healthy and scraper.view(good).healthy
    gaps = [b - a for a, b in zip(updates[good], updates[good][1:], strict=False)]
    assert len(gaps) >= 10 and max(gaps) < 0.25  # 0.4 s timeouts never showed up here


async def test_an_engine_is_read_no_more_often_than_its_page_costs_allow(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    """A page that takes 20 ms to render, a budget of 20%: a read at most every 100 ms,
    grid ticks (every 10 ms) and extra scrapes alike."""
    fake, url = engine
    fake.delay_s = 0.02
    scraper = make_scraper([url], interval_s=0.01, budget=0.2)
    async with running(scraper):
        await aeventually(lambda: len(fake.arrivals) >= 3, "three scrapes", DEADLINE_S)
        for _ in range(20):  # extra scrapes asked for all the time
            scraper.scrape_after(url, 0.0)
            await asyncio.sleep(0.01)
        await aeventually(lambda: len(fake.arrivals) >= 6, "six scrapes", DEADLINE_S)
    gaps = [b - a for a, b in zip(fake.arrivals, fake.arrivals[1:], strict=False)]
    assert min(gaps) >= 0.095, gaps  # 20 ms of page / 20%, less scheduling jitter


async def test_scrapes_stay_on_a_fixed_grid_without_drift(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    fake, url = engine
    fake.delay_s = 0.05  # each scrape takes half the interval
    scraper = make_scraper([url], interval_s=0.1)
    async with running(scraper):
        await aeventually(lambda: len(fake.arrivals) >= 10, "ten scrapes", DEADLINE_S)
    # Every scrape starts a whole number of intervals after the first (give or
    # take scheduling jitter). Sleeping the interval after each scrape instead
    # would put the second one 0.15 s in, half an interval off the grid.
    ticks = [(t - fake.arrivals[0]) / 0.1 for t in fake.arrivals[:10]]
    assert all(abs(tick - round(tick)) < 0.25 for tick in ticks), ticks
    assert round(ticks[-1]) <= 12  # at most a couple of ticks skipped under load


async def test_an_overrunning_scrape_skips_the_missed_ticks_instead_of_bursting(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    fake, url = engine
    fake.delays = [0.45]  # the first scrape overruns four and a half intervals
    scraper = make_scraper([url], interval_s=0.1, timeout_s=1.0)
    async with running(scraper):
        await aeventually(lambda: len(fake.arrivals) >= 5, "five scrapes", DEADLINE_S)
    gaps = [b - a for a, b in zip(fake.arrivals, fake.arrivals[1:], strict=False)]
    assert gaps[0] >= 0.45 and min(gaps[1:]) > 0.05, gaps


async def test_scraped_at_is_when_the_scrape_was_sent(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    # Admissions made while the answer was on its way count as not yet visible.
    fake, url = engine
    fake.delay_s = 0.3
    scraper = make_scraper([url])
    sent = time.monotonic()
    await scraper.scrape_once()
    scraped_at = scraper.view(url).scraped_at
    assert scraped_at is not None and sent <= scraped_at < sent + 0.2


async def test_each_scrape_keeps_the_count_of_jobs_it_cannot_show_read_just_before_it(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    # The sample cannot show jobs still on their way to the engine: the view keeps their
    # count beside it. Unreadable (None: Redis down) skips the scrape; the view ages.
    fake, url = engine
    counts: list[Unseen | None] = [Unseen(4, 1), None]

    async def unseen(endpoint: str, start_s: float) -> Unseen | None:
        assert endpoint == url and start_s > 0
        return counts.pop(0)

    scraper = make_scraper([url], unseen=unseen)
    await scraper.scrape_once()
    first = scraper.view(url)
    assert first.unseen == Unseen(4, 1) and first.healthy and len(fake.arrivals) == 1
    await scraper.scrape_once()
    assert scraper.view(url) == first and len(fake.arrivals) == 1  # skipped, not failed


async def test_scrape_after_adds_one_scrape_off_the_grid(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    fake, url = engine
    scraper = make_scraper([url], interval_s=30)  # the grid: one scrape at the start
    async with running(scraper):
        await aeventually(lambda: len(fake.arrivals) >= 1, "the first scrape", DEADLINE_S)
        scraper.scrape_after(url, 0.05)
        scraper.scrape_after(url, 0.05)  # one is pending already: no second
        await aeventually(lambda: len(fake.arrivals) >= 2, "the extra scrape", DEADLINE_S)
        await asyncio.sleep(0.2)
    assert len(fake.arrivals) == 2


async def test_on_update_is_called_after_every_attempt_good_or_bad(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    _, url = engine
    refused = closed_port_url()
    seen: list[str] = []
    scraper = make_scraper([url, refused], on_update=seen.append)
    await scraper.scrape_once()
    await scraper.scrape_once()
    assert sorted(seen) == sorted([url, refused] * 2)


async def test_a_raising_on_update_does_not_stop_the_scraping(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    _, url = engine
    calls: list[str] = []

    def broken(endpoint: str) -> None:
        calls.append(endpoint)
        raise RuntimeError("consumer bug")

    scraper = make_scraper([url], interval_s=0.02, on_update=broken)
    async with running(scraper) as task:
        await aeventually(lambda: len(calls) >= 3, "three updates", DEADLINE_S)
        assert not task.done()


async def test_model_names_select_each_endpoints_series(
    engine: tuple[FakeEngine, str],
    other_engine: tuple[FakeEngine, str],
    make_scraper: Callable[..., Scraper],
) -> None:
    (fake, url), (_, elsewhere) = engine, other_engine
    fake.text = vllm_text([("0", "a", 1, 2, 0.1, []), ("0", "b", 5, 6, 0.2, [])])
    scraper = make_scraper([url, elsewhere], model_names={url: "b", elsewhere: "missing"})
    await scraper.scrape_once()
    got = scraper.view(url).sample
    assert got is not None and (got.waiting, got.running) == (5.0, 6.0)
    view = scraper.view(elsewhere)
    assert view.sample is None and view.error is not None and "'missing'" in view.error


@pytest.mark.parametrize(
    "bad", [{"interval_s": 0.0}, {"timeout_s": -1.0}, {"unhealthy_after": 0}], ids=str
)
async def test_scraper_rejects_a_nonsense_configuration(
    bad: dict[str, Any], make_scraper: Callable[..., Scraper]
) -> None:
    with pytest.raises(ValueError, match="must be"):
        make_scraper(["http://127.0.0.1:1"], **bad)


async def test_an_endpoint_not_watched_is_unknown_so_unhealthy(
    make_scraper: Callable[..., Scraper],
) -> None:
    # A model loop may ask about an endpoint whose watch just ended (its lease moved).
    view = make_scraper([]).view("http://127.0.0.1:9")
    assert not view.healthy and view.sample is None


def test_the_load_capture_counts_engine_steps_and_output_tokens() -> None:
    sample = parse_metrics(LOAD, "tiny")
    assert (sample.steps, sample.generated) == (38.0, 111.0)


async def test_the_budget_never_spaces_reads_so_wide_that_metrics_go_stale(
    engine: tuple[FakeEngine, str], make_scraper: Callable[..., Scraper]
) -> None:
    """A page that takes 50 ms (an engine, or a machine, under load) at a budget of 2%
    would be read every 2.5 s; reads stay within the quiet interval (0.3 s here), which
    the dispatcher keeps at half the age at which metrics go stale."""
    fake, url = engine
    fake.delay_s = 0.05
    scraper = make_scraper([url], interval_s=0.05, idle_interval_s=0.3, budget=0.02)
    async with running(scraper):
        await aeventually(lambda: len(fake.arrivals) >= 4, "four scrapes", DEADLINE_S)
    gaps = [b - a for a, b in zip(fake.arrivals, fake.arrivals[1:], strict=False)]
    assert all(0.25 <= gap < 0.6 for gap in gaps), gaps  # 0.3 s, plus a grid tick of jitter
