"""``Settings``, the one settings object, and ``load_settings``: environment (``FAIRQ_*``)
over the YAML file named by ``FAIRQ_CONFIG``.

Validation, once, runs in three steps: the models that name an entry of ``engines`` are
resolved (``broker.settings.resolve``: its notes kept on the settings, its errors raised
with pydantic's), each field is validated, then the dependencies between them are
checked (``broker.settings.checks``). Every error names the path of its setting.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from broker.errors import SettingError
from broker.settings import checks
from broker.settings.batch import BatchSettings
from broker.settings.engine import EngineConfig
from broker.settings.http import HttpSettings
from broker.settings.keys import ApiKeyConfig
from broker.settings.model import ModelConfig
from broker.settings.quotas import QuotaConfig
from broker.settings.resolve import SettingNote, resolve

DEFAULT_BANDS = ("interactive", "default", "batch")
# OpenAI's service_tier -> band (None: the key's default band); the Batch API is "flex".
DEFAULT_SERVICE_TIERS: dict[str, str | None] = {
    "priority": "interactive",
    "default": None,
    "auto": None,
    "flex": "batch",
}

# The top-level settings by concern, in the order the generated docs show them
# (fairq.config_docs); a test holds that each setting is in exactly one.
CONCERNS: dict[str, tuple[str, ...]] = {
    "Redis": (
        "redis_url",
        "redis_cluster",
        "redis_max_connections",
        "redis_pool_timeout_s",
        "redis_command_timeout_s",
    ),
    "Bands, engines, models, keys": ("bands", "service_tiers", "engines", "models", "api_keys"),
    "Quotas": ("quotas",),
    "The gateway": (
        "max_queued_per_user",
        "queue_full_retry_after_s",
        "max_body_bytes",
        "http",
        "stream_resume_grace_s",
        "idempotency_window_s",
    ),
    "Jobs and results": (
        "result_ttl_s",
        "ready_stream_maxlen",
        "queue_deadline_s",
        "deadline_sweep_s",
    ),
    "The dispatcher": (
        "dispatcher_idle_tick_s",
        "dispatcher_lease_ms",
        "express_grant_ttl_s",
        "scrape_interval_s",
        "scrape_timeout_s",
        "scrape_budget",
        "metrics_stale_s",
        "unhealthy_after_failures",
        "status_interval_s",
        "status_top_users",
    ),
    "The workers": (
        "worker_concurrency",
        "worker_drain_timeout_s",
        "stream_linger_ms",
        "engine_api_key",
        "engine_connect_timeout_s",
        "engine_read_timeout_s",
        "engine_stream_idle_timeout_s",
        "engine_max_tries",
        "retry_backoff_ms",
        "engine_max_reroutes",
        "lease_ms",
        "lease_renew_ms",
        "job_max_attempts",
        "forget_consumer_after_ms",
        "forget_every_ms",
    ),
    "Every long-running process": ("gc_young_threshold", "metrics_port", "metrics_host"),
    "The Batch API": ("batch",),
}


class Settings(BaseSettings):
    """All of fairq's configuration; units are in the names."""

    model_config = SettingsConfigDict(
        env_prefix="FAIRQ_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    redis_url: SecretStr | None = Field(
        default=None,
        description="The Redis every process shares: redis://:PASSWORD@host:6379/0, "
        "rediss:// for TLS (add ?ssl_ca_certs=/path/ca.pem for a private CA); usually set "
        "as FAIRQ_REDIS_URL. null: `fairq up` starts a private one; every other command "
        "needs it.",
    )
    redis_cluster: bool = Field(
        default=False,
        description="true: redis_url names a node of a Redis Cluster (any node: the client "
        'finds the others). The Batch API needs a single Redis (docs/operations.md, "Redis '
        'Cluster").',
    )
    redis_max_connections: int = Field(
        default=48,
        ge=4,
        description="Redis connections per process; more callers wait their turn. Redis "
        "runs one command at a time, so more connections add no throughput; 48 keeps a "
        "gateway under 50 with its reader.",
    )
    redis_pool_timeout_s: float = Field(
        default=10.0, gt=0, description="Longest wait for a free connection of the pool."
    )
    redis_command_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="The gateway's bound on one Redis command off the streaming path (job "
        "status, cancel, resume, admin, files): a Redis that takes connections but does "
        "not answer gets its callers a 503, not a hang.",
    )

    bands: tuple[str, ...] = Field(
        default=DEFAULT_BANDS,
        description="The priority classes, highest first: strict priority between bands, "
        "fairness between users inside one.",
    )
    service_tiers: dict[str, str | None] = Field(
        default_factory=lambda: dict(DEFAULT_SERVICE_TIERS),
        description="OpenAI's service_tier -> the band it queues in; null: the key's "
        "default band (also a request without one). A band the key may not use is served "
        "in its allowed band nearest to it: priority in the key's highest. An X-Fairq-Band "
        "header wins over it; a tier not named here is a 400. Every response says the tier "
        "of the band it ran in (the first tier naming it, never auto; default where none "
        "does). The defaults name the default bands: with other bands, name yours.",
    )
    engines: tuple[EngineConfig, ...] = Field(
        default=(),
        description="The inference engines, each described once: where it is, its kind, "
        "its scheduling policy and the overrides of what fairq learns of it. Models name "
        "them.",
    )
    models: tuple[ModelConfig, ...] = Field(
        default=(),
        description="The served models, each naming its engine (an entry of engines). "
        "Several names of one engine (a base model and its LoRA adapters, or vLLM's "
        "--served-model-name a b) name the same entry: one queue and batch for all "
        '(docs/operations.md, "Several models on one engine").',
    )
    api_keys: tuple[ApiKeyConfig, ...] = Field(
        default=(),
        description="The API keys, each stored as its SHA-256, with the user it counts for "
        "and what it may use.",
    )
    quotas: tuple[QuotaConfig, ...] = Field(
        default=(),
        description="Limits of tokens and requests per UTC minute and day, each for a "
        "tenant or a user, shared by every gateway (counted in Redis as jobs are queued: "
        'README, "Quotas"). A key with a quota has OpenAI\'s x-ratelimit-* headers on '
        "each answer of the completions routes that got as far as the queue. Needs a "
        "single Redis (not redis_cluster).",
    )

    max_queued_per_user: int = Field(
        default=1000,
        ge=1,
        description="Queued jobs per user, model and band; one more is refused with 429.",
    )
    queue_full_retry_after_s: int = Field(
        default=5, ge=1, description="The Retry-After of that 429."
    )
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="A request body beyond this gets 413."
    )
    http: HttpSettings = Field(
        default_factory=HttpSettings,
        description="What each client's HTTP connections to a gateway may hold "
        '(docs/operations.md, "Limits").',
    )
    stream_resume_grace_s: float = Field(
        default=2.0,
        ge=0,
        description="A streaming client that leaves after output began may resume "
        "(Last-Event-ID), and one that sent an Idempotency-Key may send its request "
        "again, this long before its job is cancelled.",
    )
    idempotency_window_s: int = Field(
        default=86_400,
        ge=1,
        description="A request sent again with the same Idempotency-Key (per user and "
        "route) within this long gets the job, file or batch its first try made, never a "
        "second one; the same key with another request is a 409. 24 h, as Stripe and "
        "OpenAI keep theirs; a retry after result_ttl_s finds the result gone (410).",
    )

    result_ttl_s: int = Field(
        default=3600,
        ge=1,
        description="Finished jobs and their result streams expire after this.",
    )
    ready_stream_maxlen: int = Field(
        default=100_000, ge=1000, description="Entries kept in a model's ready stream."
    )
    queue_deadline_s: dict[str, float] = Field(
        default_factory=lambda: {"interactive": 600.0, "default": 3600.0},
        description='Band -> seconds a job may wait queued before it ends "expired"; a band '
        "not named waits as long as it takes. A request may ask for less with "
        "X-Fairq-Max-Queue-S, never for more.",
    )
    deadline_sweep_s: float = Field(
        default=1.0,
        gt=0,
        description="How often queued jobs are checked against their deadlines (their "
        "band's, or their own X-Fairq-Max-Queue-S): a job expires at most this late.",
    )

    dispatcher_idle_tick_s: float = Field(
        default=1.0,
        gt=0,
        description="A dispatcher with nothing to do looks again after this.",
    )
    dispatcher_lease_ms: int = Field(
        default=3000,
        ge=100,
        description="A dispatcher owns each of its models this long unless it renews "
        "(every third of it): a dead dispatcher's models move after this.",
    )
    express_grant_ttl_s: float = Field(
        default=2.0,
        ge=0,
        description="How long a gateway's grant to send a job straight to an idle engine "
        "lasts (refreshed at half that while idle); 0: no express sends.",
    )
    scrape_interval_s: float = Field(
        default=0.2, gt=0, description="How often each engine endpoint's /metrics is read."
    )
    scrape_timeout_s: float = Field(
        default=1.0, gt=0, description="A scrape slower than this failed."
    )
    scrape_budget: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="The share of an engine's time its /metrics page may take for fairq: "
        "an endpoint is read again no sooner than its last read's time over this, and at "
        "least every half of metrics_stale_s (a vLLM API server renders the page on the "
        "process that streams tokens).",
    )
    metrics_stale_s: float = Field(
        default=2.0,
        gt=0,
        description="Older metrics are stale: admission falls back to the static in-flight "
        "cap (inflight_cap).",
    )
    unhealthy_after_failures: int = Field(
        default=2, ge=1, description="Failed scrapes in a row before an endpoint is unhealthy."
    )
    status_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="How often a dispatcher publishes its status (fairq status, the dashboard).",
    )
    status_top_users: int = Field(
        default=10,
        ge=0,
        description="Users per band in the status and in the per-user metrics series.",
    )

    worker_concurrency: int = Field(
        default=64,
        ge=1,
        description="Jobs one worker runs at once (fairq worker --concurrency).",
    )
    worker_drain_timeout_s: float = Field(
        default=30.0, ge=0, description="A stopping worker waits this long for its jobs."
    )
    stream_linger_ms: float = Field(
        default=2.0,
        ge=0,
        description="Longest a streamed chunk waits to share a Redis write with other "
        "jobs' chunks.",
    )
    engine_api_key: SecretStr | None = Field(
        default=None,
        description="The key every call of an engine's /v1 API carries (Authorization: "
        "Bearer), for engines started with one (vLLM's --api-key, or VLLM_API_KEY); "
        "usually set as FAIRQ_ENGINE_API_KEY from a Secret. null: none sent.",
    )
    engine_connect_timeout_s: float = Field(
        default=5.0, gt=0, description="Longest wait for a connection to an engine."
    )
    engine_read_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="A non-streamed answer must come within this (its body comes only at the end).",
    )
    engine_stream_idle_timeout_s: float = Field(
        default=60.0, gt=0, description="A streamed answer silent this long is a hang."
    )
    engine_max_tries: int = Field(
        default=3,
        ge=1,
        description="Calls of the engine per attempt while it fails before the first token "
        "(5xx, refused, silent).",
    )
    retry_backoff_ms: float = Field(
        default=250.0,
        ge=0,
        description="The wait before call n of the engine: this times 2^(n-1).",
    )
    engine_max_reroutes: int = Field(
        default=3,
        ge=0,
        description="Times a job whose engine never took it (refused, cut before the "
        "answer, 503: a replica going away) goes to another endpoint; past them it fails. "
        "0: never.",
    )
    lease_ms: int = Field(
        default=15_000,
        ge=100,
        description="A running job's ready entry is leased to its worker: idle this long, "
        "it is taken over by another worker (a dead worker's jobs).",
    )
    lease_renew_ms: int = Field(
        default=3_000,
        ge=20,
        description="How often a worker renews its leases: at most half of lease_ms.",
    )
    job_max_attempts: int = Field(
        default=3,
        ge=1,
        description="Starts of a job whose worker died before its first token; then it "
        "fails as a dead letter.",
    )
    forget_consumer_after_ms: int = Field(
        default=3_600_000,
        ge=1000,
        description="A stopped or dead worker's name idle this long with nothing pending "
        "leaves the ready groups.",
    )
    forget_every_ms: int = Field(
        default=60_000,
        ge=100,
        description="How often each worker looks for such names.",
    )

    gc_young_threshold: int = Field(
        default=50_000,
        ge=0,
        description="Net allocations between young garbage collections; 0: CPython's "
        "defaults (700, and nothing frozen).",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="The Prometheus /metrics port of dispatchers, workers, batch workers and "
        "the KEDA scaler (the gateway's: http.metrics_port). null: each "
        "component's own (dispatcher 9464, worker 9465, batch worker 9466, KEDA scaler "
        "9468), or a free one, logged, when "
        "another process on the host holds it; 0: no metrics server.",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="The address the metrics servers listen on: loopback, only this host "
        "reads them; Kubernetes pods set 0.0.0.0, so that Prometheus can reach them.",
    )

    batch: BatchSettings = Field(
        default_factory=BatchSettings,
        description="The Batch API: its files, batches and RQ batch workers.",
    )

    _notes: tuple[SettingNote, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _resolve_engines(cls, data: Any, handler: ModelWrapValidatorHandler[Settings]) -> Settings:
        if not isinstance(data, dict):
            return handler(data)
        resolution = resolve(data)
        try:
            settings = handler(resolution.data)
        except ValidationError as exc:
            shown = [e for e in exc.errors() if not resolution.hides(e["loc"])]
            raise _with(shown, resolution.errors) from None
        if resolution.errors:
            raise _with([], resolution.errors)
        settings._notes = resolution.notes
        return settings

    @model_validator(mode="after")
    def _check_dependencies(self) -> Settings:
        checks.check(self)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_path = os.environ.get("FAIRQ_CONFIG")
        if config_path:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=Path(config_path)))
        return tuple(sources)

    @property
    def notes(self) -> tuple[SettingNote, ...]:
        """The settings the input writes in their old place, each with where it goes
        (``broker.settings.resolve``); empty for settings given as objects."""
        return self._notes

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def redis_address(self) -> str:
        """Where Redis is, for the operator's log: the URL without its credentials
        (``redis://host:6379/0``, ``unix:///run/redis.sock``); ``unset`` when none is."""
        if self.redis_url is None:
            return "unset"
        parts = urlsplit(self.redis_url.get_secret_value())
        host = parts.hostname or ""
        where = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{where}{port}{parts.path}"

    def require_redis_url(self) -> str:
        if self.redis_url is None:
            raise ValueError(
                "FAIRQ_REDIS_URL is not set: point it at your Redis (redis://host:6379/0), "
                "or start a private one: `fairq redis` prints its URL (`fairq up` starts "
                "one with the whole stack)"
            )
        return self.redis_url.get_secret_value()


def _with(errors: list[Any], more: tuple[SettingError, ...]) -> ValidationError:
    """pydantic's ``errors`` and ``more`` as one ``ValidationError``: why a model's engine
    cannot be resolved is told with every other problem, as pydantic tells a validator's
    (the path in the error's ``ctx``)."""
    details = [
        InitErrorDetails(type=e["type"], loc=e["loc"], input=e["input"], ctx=e.get("ctx", {}))
        for e in errors
    ]
    details += [
        InitErrorDetails(type="value_error", loc=(), input=None, ctx={"error": error})
        for error in more
    ]
    return ValidationError.from_exception_data(Settings.__name__, details)


def load_settings(**overrides: object) -> Settings:
    """Read and validate the configuration once; raises a readable error on bad input."""
    config_path = os.environ.get("FAIRQ_CONFIG")
    if config_path and not Path(config_path).is_file():
        raise FileNotFoundError(f"FAIRQ_CONFIG names {config_path!r}, which is not a file")
    return Settings(**overrides)  # type: ignore[arg-type]
