"""The simulator's /metrics: vLLM's metric names, types, labels and buckets.

Each app owns its CollectorRegistry, so several simulated engines can live in
one process (tests). Names, types and label names follow a vLLM 0.32 capture
(`engine="0"`, `model_name`); values are the simulator's estimates. Gauges are
computed at scrape time from the engine's state, so the engine never pays for
them per token.
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "EngineState", "ModelMetrics", "SimMetrics"]

ENGINE_INDEX = "0"
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

# Bucket bounds as in vLLM 0.32's own histograms (from metrics_load.txt).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
# vLLM's buckets for tokens per engine step (powers of two up to the step budget)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

_LABELS = ("engine", "model_name")
_REASON_LABELS = ("engine", "finished_reason", "model_name")


class EngineState(Protocol):
    """Per-model engine state that the gauges read at scrape time."""

    def num_waiting(self, model: str) -> int: ...

    def num_running(self, model: str) -> int: ...

    def kv_cache_usage(self, model: str) -> float: ...


class SimMetrics:
    """All metric families of one simulated engine."""

    def __init__(self, models: list[str]) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            _LABELS,
            registry=reg,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            _LABELS,
            registry=reg,
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            _LABELS,
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", _LABELS, registry=reg
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            _LABELS,
            registry=reg,
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            _LABELS,
            registry=reg,
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            _LABELS,
            registry=reg,
        )
        self.preemptions = Counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            _LABELS,
            registry=reg,
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            _REASON_LABELS,
            registry=reg,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            _LABELS,
            buckets=TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            _LABELS,
            buckets=ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=reg,
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _LABELS,
            buckets=REQUEST_LATENCY_BUCKETS,
            registry=reg,
        )
        # One observation per engine step (its _count is the engine's steps), as vLLM V1.
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            _LABELS,
            buckets=ITERATION_BUCKETS,
            registry=reg,
        )
        # The simulator's own: its steps' modeled time, and the time its timeline lost while
        # busy (its event loop, which also streams every token, fell too far behind to make
        # it up: ``_engine``). A benchmark reports both: the loss is the simulator's, not an
        # engine's.
        self.step_modeled = Counter(
            "fairq_sim_step_seconds", "Modeled time of the simulator's steps.", registry=reg
        )
        self.step_overrun = Counter(
            "fairq_sim_step_overrun_seconds",
            "Time the simulator's step timeline lost while busy: its loop fell behind.",
            registry=reg,
        )
        self._models = {model: ModelMetrics(self, model) for model in models}
        self._steps = [self.iteration_tokens.labels(ENGINE_INDEX, m) for m in models]

    def stepped(self, tokens: int, modeled_s: float, lost_s: float) -> None:
        """One engine step computed ``tokens`` tokens (every served model shares it), in
        ``modeled_s`` by the profile, after ``lost_s`` the timeline lost before it."""
        for series in self._steps:
            series.observe(tokens)
        self.step_modeled.inc(modeled_s)
        self.step_overrun.inc(lost_s)

    def model(self, name: str) -> ModelMetrics:
        return self._models[name]

    def watch(self, state: EngineState) -> None:
        """Make the gauges read `state` whenever /metrics is scraped."""
        for model in self._models:
            labels = {"engine": ENGINE_INDEX, "model_name": model}
            self.running.labels(**labels).set_function(partial(state.num_running, model))
            self.waiting.labels(**labels).set_function(partial(state.num_waiting, model))
            self.kv_usage.labels(**labels).set_function(partial(state.kv_cache_usage, model))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class ModelMetrics:
    """The label-bound series of one served model; the engine calls these."""

    __slots__ = (
        "_e2e",
        "_gen",
        "_hits",
        "_itl",
        "_preempt",
        "_prompt",
        "_queries",
        "_queue",
        "_success",
        "_ttft",
    )

    def __init__(self, families: SimMetrics, model: str) -> None:
        labels = {"engine": ENGINE_INDEX, "model_name": model}
        self._prompt = families.prompt_tokens.labels(**labels)
        self._gen = families.generation_tokens.labels(**labels)
        self._ttft = families.ttft.labels(**labels)
        self._itl = families.itl.labels(**labels)
        self._e2e = families.e2e.labels(**labels)
        self._queue = families.queue_time.labels(**labels)
        self._preempt = families.preemptions.labels(**labels)
        self._queries = families.prefix_queries.labels(**labels)
        self._hits = families.prefix_hits.labels(**labels)
        # Create every reason up front: vLLM shows them all, at 0, from start-up.
        self._success = {
            reason: families.request_success.labels(finished_reason=reason, **labels)
            for reason in FINISHED_REASONS
        }

    def first_token(self, prompt_tokens: int, ttft_s: float) -> None:
        # As vLLM V1: a prompt counts once, with its first token, however often it
        # was prefilled again after a preemption.
        self._prompt.inc(prompt_tokens)
        self._gen.inc()
        self._ttft.observe(ttft_s)

    def next_token(self, itl_s: float) -> None:
        self._gen.inc()
        self._itl.observe(itl_s)

    def finished(self, reason: str, e2e_s: float, queue_s: float) -> None:
        self._success[reason].inc()
        self._e2e.observe(e2e_s)
        self._queue.observe(queue_s)

    def prefix_lookup(self, queried: int, hit: int) -> None:
        """A request looked its prompt up in the prefix cache (vLLM counts tokens)."""
        self._queries.inc(queried)
        self._hits.inc(hit)

    def preempted(self) -> None:
        self._preempt.inc()

    def aborted(self) -> None:
        self._success["abort"].inc()
