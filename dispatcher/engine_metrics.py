"""Engine metrics: one ``/metrics`` text in, one ``EngineSample`` out (pure, no I/O).

The admission policy needs four things from an engine: how many requests wait
in its queue, how many run, how full its KV cache is, and how fast it emits
tokens; a queued job's wait estimate also needs how fast it ends requests
(``engine_drain_per_s``). vLLM, SGLang, TGI and llama.cpp expose them under different
names; the engine is recognised by its queue gauge, and the sample says which it was.
Text comes apart with prometheus_client's own parser, and series are matched by exact
sample name, so look-alikes such as ``vllm:num_requests_waiting_by_reason`` or the
per-request histogram ``vllm:request_time_per_output_token_seconds`` are never mixed in.

A dispatcher reads every endpoint several times a second, and a vLLM page has hundreds
of lines, nearly all of them buckets and series admission never reads. Before the
parser sees the page, one regular expression (C speed, on the page's bytes) keeps only
the sample lines of the names below (``wanted_lines``); comments go too, so each sample
keeps its own name. Lines admission does not read are not read at all: a page that is
not exposition (an HTML error page, a wrong URL) has none of the queue gauges and is
refused for that, and the scraper refuses a response whose content type is not
Prometheus text. ``parse_wanted`` parses what is kept, so a caller that sees the same
wanted lines as last time (an idle engine) may keep the sample it got from them.

Names, and where they were checked (each engine's exposition text, built from these
sources, is in ``tests/fixtures``; its README says which file and commit):

- vLLM, current (V1; the real 0.32 captures in ``tests/fixtures/vllm-0.32-cpu``):
  ``vllm:num_requests_waiting``, ``vllm:num_requests_running``,
  ``vllm:kv_cache_usage_perc``, histograms ``vllm:inter_token_latency_seconds`` and
  ``vllm:e2e_request_latency_seconds`` (arrival to end, queue included); every
  series is labelled ``engine`` and ``model_name``.
- vLLM, older (V0: ``vllm/engine/metrics.py`` at vllm-project/vllm commit
  00c33e81b526a179a6afb86512d1e8198965ee2f, label ``model_name`` only): the
  same queue gauges, ``vllm:gpu_cache_usage_perc`` and histogram
  ``vllm:time_per_output_token_seconds``, both observed once per output token.
  Where a release exposes both names the current one wins.
- SGLang (sgl-project/sglang ``python/sglang/srt/metrics/collector.py`` at commit
  00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538; labels ``model_name``, ``engine_type``,
  ``tp_rank``, ``pp_rank``, and ``dp_rank`` with data parallelism):
  ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage`` (the
  KV pool's use, 0..1), histograms ``sglang:inter_token_latency_seconds`` (its _sum
  grows by each output interval and its _count by the tokens in it; older releases:
  ``sglang:time_per_output_token_seconds``) and ``sglang:e2e_request_latency_seconds``.
  An early metrics module (``python/sglang/srt/metrics/metrics_collector.py`` at
  commit 029316b82e8ad792d693c422deac84e2608115c9) named the queue gauges
  ``sglang:num_requests_waiting`` and ``sglang:num_requests_running``; they are read too.
  The scheduler sets its gauges when it logs a prefill batch and every
  ``--decode-log-interval`` decode steps (40 by default), so they trail the engine by
  up to that many steps. With ``--enable-metrics-for-all-schedulers`` every tensor- and
  pipeline-parallel rank exports the same queue, series that differ only in ``tp_rank``,
  ``pp_rank`` or ``moe_ep_rank``: those are copies and count once (``_Dialect.copies``).
  Its ``sglang:generation_tokens_total`` moves only when a request ends, so it says
  nothing about engine steps between two scrapes and is not read; the engine's steps
  are its counter ``sglang:cuda_graph_passes_total`` (one per forward pass, labelled
  ``mode``).
- TGI (huggingface/text-generation-inference ``docs/source/reference/metrics.md``
  and ``router/src/server.rs``, which gives every ``*duration`` metric histogram
  buckets; unchanged from commit 53fdbe617d4f3cc358842ad96914393ad6b6e4ca to
  db931fcf42da018a3657580c64bf2720f167f9ab, the last before the project went into
  maintenance): ``tgi_queue_size``, ``tgi_batch_current_size``, histograms
  ``tgi_request_mean_time_per_token_duration`` and ``tgi_request_duration`` (e2e latency).
  TGI observes that histogram once per *finished request* (its mean time per
  token), not per token, so its Δsum/Δcount lags and is None while no request
  finishes. Its counter ``tgi_batch_inference_count`` (labelled ``method``, prefill or
  decode; ``backends/v3/src/backend.rs``) grows by one per forward pass of the batch:
  the engine's steps. TGI has no KV-cache gauge.
- llama.cpp's ``llama-server --metrics`` (ggml-org/llama.cpp
  ``tools/server/server-context.cpp`` at commit
  fb4026604c67c682f552337ec9b91eced0abd35a; older builds ``examples/server/server.cpp``,
  e.g. at 61e588abcc3e418681e9528b46d61f5b23225fe2; no labels): the server runs
  ``--parallel`` slots, one request each, decoded together in one batch (its batch is
  its slot count). Gauges ``llamacpp:requests_processing`` (busy slots: running) and
  ``llamacpp:requests_deferred`` (requests waiting for a free slot); counter
  ``llamacpp:n_decode_total`` (``llama_decode()`` calls: the engine's steps, live);
  counters ``llamacpp:tokens_predicted_seconds_total`` and
  ``llamacpp:tokens_predicted_total``, added to when a request ends (its generation
  time and tokens), so their Δ/Δ is the per-token time of the requests that ended
  between two scrapes (None while none ends, as TGI's). Older builds also have gauge
  ``llamacpp:kv_cache_usage_ratio`` (KV cells used over the context size); current
  ones have no KV gauge. There is no end-to-end latency, so no drain estimate. Without
  ``--metrics`` the page answers 501 and the endpoint is unhealthy.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# sample name -> [(labels, value)], one entry per series
_Series = Mapping[str, Sequence[tuple[Mapping[str, str], float]]]


@dataclass(frozen=True)
class EngineSample:
    waiting: float  # requests waiting in the engine's queue
    running: float  # requests in the running batch
    kv_usage: float | None  # KV-cache usage 0..1 (the fullest engine's); None: not reported
    tpot_sum_s: float | None  # cumulative seconds of the per-output-token latency measure
    tpot_count: float | None  # cumulative output tokens of the same measure
    steps: float | None = None  # cumulative engine steps (None: the engine does not count them)
    generated: float | None = None  # cumulative output tokens
    e2e_sum_s: float | None = None  # cumulative _sum of the end-to-end request latency
    e2e_count: float | None = None  # its _count: requests the engine ended
    # Whose names the page used (vllm, sglang, tgi, llamacpp): a label, not a figure, so
    # samples of equal figures compare equal.
    engine: str = field(default="", compare=False)


class MetricsError(ValueError):
    """Text that is not Prometheus exposition, or lacks the engine's queue gauges."""


def _histogram_of(*names: str) -> tuple[tuple[str, str], ...]:
    """Histograms as (sum, count) sample-name pairs."""
    return tuple((f"{name}_sum", f"{name}_count") for name in names)


@dataclass(frozen=True)
class _Dialect:
    engine: str
    waiting: tuple[str, ...]  # gauge names, preferred first; the first is the engine's mark
    running: tuple[str, ...]
    kv_usage: tuple[str, ...] = ()  # gauge names, preferred first
    tpot: tuple[tuple[str, str], ...] = ()  # (sum, count) sample names, preferred first
    steps: tuple[str, ...] = ()  # samples counting the engine's steps, preferred first
    generated: str = ""  # counter of output tokens, moving as they are made ("": none)
    e2e: tuple[tuple[str, str], ...] = ()  # (sum, count) of a request's end-to-end latency
    # Labels of series that are copies of one engine's figures (every rank of one tensor-
    # parallel engine exporting the same queue): such series count once, not summed.
    copies: frozenset[str] = frozenset()


_DIALECTS = (
    _Dialect(
        engine="vllm",
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        tpot=_histogram_of(
            "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"
        ),
        steps=("vllm:iteration_tokens_total_count",),  # a histogram observed once per step
        generated="vllm:generation_tokens_total",
        e2e=_histogram_of("vllm:e2e_request_latency_seconds"),
    ),
    _Dialect(
        engine="sglang",
        waiting=("sglang:num_queue_reqs", "sglang:num_requests_waiting"),
        running=("sglang:num_running_reqs", "sglang:num_requests_running"),
        kv_usage=("sglang:token_usage",),
        tpot=_histogram_of(
            "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"
        ),
        # One per forward pass, labelled mode (decode or prefill, with CUDA graph or not).
        steps=("sglang:cuda_graph_passes_total",),
        e2e=_histogram_of("sglang:e2e_request_latency_seconds"),
        copies=frozenset({"tp_rank", "pp_rank", "moe_ep_rank"}),
    ),
    _Dialect(
        engine="tgi",
        waiting=("tgi_queue_size",),
        running=("tgi_batch_current_size",),
        tpot=_histogram_of("tgi_request_mean_time_per_token_duration"),
        # Labelled method, prefill or decode: both are steps. A counter without the _total
        # suffix, which prometheus-client's parser adds when it reads the TYPE line (a whole
        # page parsed, not only its wanted lines).
        steps=("tgi_batch_inference_count", "tgi_batch_inference_count_total"),
        e2e=_histogram_of("tgi_request_duration"),
    ),
    _Dialect(
        engine="llamacpp",
        waiting=("llamacpp:requests_deferred",),
        running=("llamacpp:requests_processing",),
        kv_usage=("llamacpp:kv_cache_usage_ratio",),
        tpot=(("llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total"),),
        steps=("llamacpp:n_decode_total",),
    ),
)


def _sample_names(dialect: _Dialect) -> tuple[str, ...]:
    """The sample names ``parse_metrics`` reads for one dialect."""
    names = [*dialect.waiting, *dialect.running, *dialect.kv_usage]
    names += [name for pair in (*dialect.tpot, *dialect.e2e) for name in pair]
    names += [*dialect.steps, *([dialect.generated] if dialect.generated else [])]
    return tuple(names)


def _wanted_pattern() -> re.Pattern[bytes]:
    """A line that starts with a wanted name, then its labels or its value. The names are
    grouped by their engine's prefix (``vllm:``, ``tgi_``), so that a line of another
    metric is dismissed after a few bytes; and each match begins with the newline before
    it, a literal the regular expression engine searches for at memchr speed (``^`` in
    MULTILINE mode would be tried at every byte)."""
    groups: dict[str, list[str]] = {}
    for dialect in _DIALECTS:
        for name in _sample_names(dialect):
            cut = name.find(":") + 1 or name.find("_") + 1
            groups.setdefault(name[:cut], []).append(name[cut:])
    alternatives = "|".join(
        re.escape(prefix) + "(?:" + "|".join(map(re.escape, sorted(set(rest)))) + ")"
        for prefix, rest in groups.items()
    )
    return re.compile(f"\n((?:{alternatives})[{{ \t][^\n]*)".encode())


_WANTED = _wanted_pattern()


def wanted_lines(page: bytes) -> bytes:
    """The sample lines of ``page`` that ``parse_wanted`` reads, nothing else, in order."""
    return b"\n".join(_WANTED.findall(b"\n" + page)) + b"\n"


def parse_metrics(page: bytes | str, model_name: str | None = None) -> EngineSample:
    """The engine's state in one scrape, summed over its series (data-parallel engines).

    With ``model_name``, only series whose ``model_name`` label equals it count
    (vLLM and SGLang label every series; TGI and llama.cpp label none, so pass None
    for them). Raises ``MetricsError`` when the wanted lines do not parse, name no known
    engine, or have no queue series for ``model_name``: a scrape that cannot say how
    long the queue is must never read as an empty queue.
    """
    if isinstance(page, str):
        page = page.encode()
    return parse_wanted(wanted_lines(page), model_name)


def parse_wanted(lines: bytes, model_name: str | None = None) -> EngineSample:
    """``parse_metrics`` of lines ``wanted_lines`` kept (or of a whole page: the same
    sample, parsed the slow way)."""
    try:
        text = lines.decode()
    except UnicodeDecodeError as exc:
        raise MetricsError(f"not Prometheus text exposition: {exc}") from exc
    series: _Series = _parse(text)
    dialect = _dialect(series)
    if model_name is not None:
        series = _only_model(series, model_name)
    tpot_sum_s, tpot_count = _histogram(series, dialect.tpot)
    e2e_sum_s, e2e_count = _histogram(series, dialect.e2e)
    return EngineSample(
        waiting=_queue_gauge(series, dialect.waiting, dialect.copies, model_name),
        running=_queue_gauge(series, dialect.running, dialect.copies, model_name),
        kv_usage=_fullest(series, dialect.kv_usage),
        tpot_sum_s=tpot_sum_s,
        tpot_count=tpot_count,
        steps=next((_total(series, n, dialect.copies) for n in dialect.steps if n in series), None),
        generated=_total(series, dialect.generated, dialect.copies) if dialect.generated else None,
        e2e_sum_s=e2e_sum_s,
        e2e_count=e2e_count,
        engine=dialect.engine,
    )


def recent_tpot_s(previous: EngineSample | None, current: EngineSample) -> float | None:
    """Mean time per output token between two scrapes: Δsum / Δcount.

    None when there is no previous sample, no histogram, no token in between,
    or a counter went backwards (the engine restarted). A restart followed by
    more tokens than before cannot be told apart from two samples; it yields
    one wrong figure, corrected at the next scrape.
    """
    if previous is None:
        return None
    sums = (previous.tpot_sum_s, current.tpot_sum_s)
    counts = (previous.tpot_count, current.tpot_count)
    if sums[0] is None or sums[1] is None or counts[0] is None or counts[1] is None:
        return None
    tokens, seconds = counts[1] - counts[0], sums[1] - sums[0]
    if tokens <= 0 or seconds < 0:
        return None
    return seconds / tokens


@dataclass(frozen=True)
class PaceWindow:
    """How fast an engine ends requests and how long its steps are, over windows of at
    least ``PACE_WINDOW_S``: the counts at the start of the current window (the end-to-end
    histogram's _count, the per-token histogram's _sum and _count), and the figures over
    the whole window before. Scrapes come every few engine steps, and over so short a time
    one request more or less, or one prefill step more or less, swings either figure
    severalfold."""

    start_s: float  # the clock when the current window began
    start_ended: float  # requests the engine had ended then
    start_tpot: tuple[float, float] | None  # the per-token histogram's (_sum, _count) then
    ends_per_s: float | None = None  # requests ended per second over the last whole window
    step_s: float | None = None  # mean time per output token over it (None: no token)


PACE_WINDOW_S = 1.0


def next_pace_window(
    window: PaceWindow | None, sample: EngineSample, at: float
) -> PaceWindow | None:
    """The window after a good scrape sent at ``at`` (same clock). None: the engine does not
    count its ended requests. A count that went backwards (the engine restarted) starts a
    new window, with no figures until it ends."""
    ended = sample.e2e_count
    if ended is None:
        return None
    tpot = None
    if sample.tpot_sum_s is not None and sample.tpot_count is not None:
        tpot = (sample.tpot_sum_s, sample.tpot_count)
    if window is None or ended < window.start_ended:
        return PaceWindow(at, ended, tpot)
    elapsed = at - window.start_s
    if elapsed < PACE_WINDOW_S:
        return window
    step_s = None
    if tpot is not None and window.start_tpot is not None:
        seconds, tokens = tpot[0] - window.start_tpot[0], tpot[1] - window.start_tpot[1]
        step_s = seconds / tokens if tokens > 0 and seconds >= 0 else None
    return PaceWindow(at, ended, tpot, (ended - window.start_ended) / elapsed, step_s)


def engine_drain_per_s(sample: EngineSample) -> float | None:
    """Requests the engine ends per second, by Little's law: the requests in it over the
    mean time one spends in it. None when nothing is in it, or nothing says how long.

    The mean time is the end-to-end histogram's _sum/_count over the engine's life
    (queue and run, so the requests counted are the waiting ones too). Before the engine
    ended any request, all of the per-token histogram's _sum is the decode time so far
    of the running ones: a request takes at least their mean of it, and the drain is at
    most the running ones over that (a bound that tightens as the batch ages).
    """
    if sample.e2e_sum_s is None or sample.e2e_count is None:
        return None  # the engine does not say how long its requests take
    if sample.e2e_count > 0:
        in_engine, mean_s = sample.running + sample.waiting, sample.e2e_sum_s / sample.e2e_count
        return in_engine / mean_s if in_engine > 0 and mean_s > 0 else None
    if sample.running <= 0 or sample.tpot_sum_s is None or sample.tpot_sum_s <= 0:
        return None
    return sample.running / (sample.tpot_sum_s / sample.running)


def _parse(text: str) -> dict[str, list[tuple[Mapping[str, str], float]]]:
    series: dict[str, list[tuple[Mapping[str, str], float]]] = {}
    try:
        # The parser is lazy: errors surface while iterating, so iterate inside the try.
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                series.setdefault(sample.name, []).append((sample.labels, float(sample.value)))
    except ValueError as exc:
        raise MetricsError(f"not Prometheus text exposition: {exc}") from exc
    return series


def _dialect(series: _Series) -> _Dialect:
    for dialect in _DIALECTS:
        if any(name in series for name in dialect.waiting):
            return dialect
    known = ", ".join(name for d in _DIALECTS for name in d.waiting)
    raise MetricsError(f"no engine queue gauge in the metrics (looked for {known})")


def _only_model(series: _Series, model_name: str) -> _Series:
    return {
        name: [(labels, value) for labels, value in rows if labels.get("model_name") == model_name]
        for name, rows in series.items()
    }


def _queue_gauge(
    series: _Series, names: Sequence[str], copies: frozenset[str], model_name: str | None
) -> float:
    rows = next((series[name] for name in names if series.get(name)), ())
    if not rows:
        scope = f" for model_name={model_name!r}" if model_name is not None else ""
        raise MetricsError(f"no {' or '.join(names)} series{scope}")
    total = math.fsum(_once_per_engine(rows, copies))
    # NaN or a negative count would make any queue test pass or fail at random.
    if not math.isfinite(total) or total < 0:
        raise MetricsError(f"{names[0]} is {total}, not a count")
    return total


def _once_per_engine(
    rows: Sequence[tuple[Mapping[str, str], float]], copies: frozenset[str]
) -> list[float]:
    """One value per engine: series that differ only in ``copies`` labels are one engine's
    figure exported by each of its ranks (the largest stands for them); the rest are
    separate engines (data parallelism), which the caller sums."""
    if not copies:
        return [value for _, value in rows]
    engines: dict[tuple[tuple[str, str], ...], float] = {}
    for labels, value in rows:
        key = tuple(sorted((k, v) for k, v in labels.items() if k not in copies))
        # max() would drop a NaN in either place; keep it, so the caller refuses it.
        engines[key] = (
            value if key not in engines or math.isnan(value) else max(engines[key], value)
        )
    return list(engines.values())


def _fullest(series: _Series, names: Sequence[str]) -> float | None:
    # The fullest engine, not the mean: one engine out of KV blocks preempts its
    # requests even while its data-parallel siblings have room.
    for name in names:
        values = [value for _, value in series.get(name, ()) if math.isfinite(value)]
        if values:
            return max(values)
    return None


def _total(series: _Series, name: str, copies: frozenset[str]) -> float | None:
    rows = series.get(name, ())
    return math.fsum(_once_per_engine(rows, copies)) if rows else None


def _histogram(
    series: _Series, pairs: Sequence[tuple[str, str]]
) -> tuple[float | None, float | None]:
    for sum_name, count_name in pairs:
        sums, counts = series.get(sum_name, ()), series.get(count_name, ())
        if sums and counts:
            return math.fsum(v for _, v in sums), math.fsum(v for _, v in counts)
    return None, None
