"""Engine metrics: one ``/metrics`` text in, one ``EngineSample`` out (pure, no I/O).

The admission policy needs four things from an engine: how many requests wait
in its queue, how many run, how full its KV cache is, and how fast it emits
tokens; a queued job's wait estimate also needs how fast it ends requests
(``engine_drain_per_s``). vLLM and TGI expose them under different names; the
engine is recognised by its queue gauge. Text comes apart with prometheus_client's own
parser, and series are matched by exact sample name, so look-alikes such as
``vllm:num_requests_waiting_by_reason`` or the per-request histogram
``vllm:request_time_per_output_token_seconds`` are never mixed in.

A dispatcher reads every endpoint several times a second, and a vLLM page has hundreds
of lines, nearly all of them buckets and series admission never reads. Before the
parser sees the page, one regular expression (C speed, on the page's bytes) keeps only
the sample lines of the names below (``wanted_lines``); comments go too, so each sample
keeps its own name. Lines admission does not read are not read at all: a page that is
not exposition (an HTML error page, a wrong URL) has none of the queue gauges and is
refused for that, and the scraper refuses a response whose content type is not
Prometheus text. ``parse_wanted`` parses what is kept, so a caller that sees the same
wanted lines as last time (an idle engine) may keep the sample it got from them.

Names, and where they were checked:

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
  00ae9c1590d2d0bb6c0bfff39e312c34ae3dd538, label ``model_name`` and more):
  ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``, ``sglang:token_usage`` (the
  KV pool's use, 0..1), histograms ``sglang:inter_token_latency_seconds`` (its _sum
  grows by each output interval and its _count by the tokens in it; older releases:
  ``sglang:time_per_output_token_seconds``) and ``sglang:e2e_request_latency_seconds``.
  Its ``sglang:generation_tokens_total`` moves only when a request ends, so it says
  nothing about engine steps between two scrapes and is not read.
- TGI (huggingface/text-generation-inference ``docs/source/reference/metrics.md``
  at commit 53fdbe617d4f3cc358842ad96914393ad6b6e4ca, and ``router/src/server.rs``,
  which gives every ``*duration`` metric histogram buckets): ``tgi_queue_size``,
  ``tgi_batch_current_size``, histograms ``tgi_request_mean_time_per_token_duration`` and
  ``tgi_request_duration`` (e2e latency).
  TGI observes that histogram once per *finished request* (its mean time per
  token), not per token, so its Δsum/Δcount lags and is None while no request
  finishes. TGI has no KV-cache gauge.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

# sample name -> [(labels, value)], one entry per series
_Series = Mapping[str, Sequence[tuple[Mapping[str, str], float]]]


@dataclass(frozen=True)
class EngineSample:
    waiting: float  # requests waiting in the engine's queue
    running: float  # requests in the running batch
    kv_usage: float | None  # KV-cache usage 0..1 (the fullest engine's); None: not reported
    tpot_sum_s: float | None  # cumulative _sum of the per-output-token latency histogram
    tpot_count: float | None  # cumulative _count of the same histogram
    steps: float | None = None  # cumulative engine steps (vLLM's iteration histogram _count)
    generated: float | None = None  # cumulative output tokens
    e2e_sum_s: float | None = None  # cumulative _sum of the end-to-end request latency
    e2e_count: float | None = None  # its _count: requests the engine ended


class MetricsError(ValueError):
    """Text that is not Prometheus exposition, or lacks the engine's queue gauges."""


@dataclass(frozen=True)
class _Dialect:
    engine: str
    waiting: str
    running: str
    kv_usage: tuple[str, ...]  # gauge names, preferred first
    tpot: tuple[str, ...]  # histogram names, preferred first
    steps: str = ""  # histogram whose _count is the engine's steps ("": none)
    generated: str = ""  # counter of output tokens ("": none)
    e2e: tuple[str, ...] = ()  # histograms of a request's end-to-end latency


_DIALECTS = (
    _Dialect(
        engine="vllm",
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        tpot=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        steps="vllm:iteration_tokens_total",
        generated="vllm:generation_tokens_total",
        e2e=("vllm:e2e_request_latency_seconds",),
    ),
    _Dialect(
        engine="sglang",
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage=("sglang:token_usage",),
        tpot=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        e2e=("sglang:e2e_request_latency_seconds",),
    ),
    _Dialect(
        engine="tgi",
        waiting="tgi_queue_size",
        running="tgi_batch_current_size",
        kv_usage=(),
        tpot=("tgi_request_mean_time_per_token_duration",),
        e2e=("tgi_request_duration",),
    ),
)


def _sample_names(dialect: _Dialect) -> tuple[str, ...]:
    """The sample names ``parse_metrics`` reads for one dialect."""
    histograms = (*dialect.tpot, *dialect.e2e)
    names = [dialect.waiting, dialect.running, *dialect.kv_usage]
    names += [f"{h}{suffix}" for h in histograms for suffix in ("_sum", "_count")]
    names += [f"{dialect.steps}_count"] if dialect.steps else []
    names += [dialect.generated] if dialect.generated else []
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
    (vLLM labels every series; TGI labels none, so pass None for TGI). Raises
    ``MetricsError`` when the wanted lines do not parse, name no known engine, or
    have no queue series for ``model_name``: a scrape that cannot say how long
    the queue is must never read as an empty queue.
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
        waiting=_queue_gauge(series, dialect.waiting, model_name),
        running=_queue_gauge(series, dialect.running, model_name),
        kv_usage=_fullest(series, dialect.kv_usage),
        tpot_sum_s=tpot_sum_s,
        tpot_count=tpot_count,
        steps=_total(series, f"{dialect.steps}_count") if dialect.steps else None,
        generated=_total(series, dialect.generated) if dialect.generated else None,
        e2e_sum_s=e2e_sum_s,
        e2e_count=e2e_count,
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
        if dialect.waiting in series:
            return dialect
    known = ", ".join(d.waiting for d in _DIALECTS)
    raise MetricsError(f"no engine queue gauge in the metrics (looked for {known})")


def _only_model(series: _Series, model_name: str) -> _Series:
    return {
        name: [(labels, value) for labels, value in rows if labels.get("model_name") == model_name]
        for name, rows in series.items()
    }


def _queue_gauge(series: _Series, name: str, model_name: str | None) -> float:
    rows = series.get(name, ())
    if not rows:
        scope = f" for model_name={model_name!r}" if model_name is not None else ""
        raise MetricsError(f"no {name} series{scope}")
    total = math.fsum(value for _, value in rows)
    # NaN or a negative count would make any queue test pass or fail at random.
    if not math.isfinite(total) or total < 0:
        raise MetricsError(f"{name} is {total}, not a count")
    return total


def _fullest(series: _Series, names: Sequence[str]) -> float | None:
    # The fullest engine, not the mean: one engine out of KV blocks preempts its
    # requests even while its data-parallel siblings have room.
    for name in names:
        values = [value for _, value in series.get(name, ()) if math.isfinite(value)]
        if values:
            return max(values)
    return None


def _total(series: _Series, name: str) -> float | None:
    rows = series.get(name, ())
    return math.fsum(value for _, value in rows) if rows else None


def _histogram(series: _Series, names: Sequence[str]) -> tuple[float | None, float | None]:
    for name in names:
        sums, counts = series.get(f"{name}_sum", ()), series.get(f"{name}_count", ())
        if sums and counts:
            return math.fsum(v for _, v in sums), math.fsum(v for _, v in counts)
    return None, None
