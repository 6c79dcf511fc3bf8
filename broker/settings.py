"""fairq's one settings object: environment (``FAIRQ_*``) over a YAML file.

``load_settings()`` reads the environment and the YAML file named by
``FAIRQ_CONFIG`` once, validates everything and returns a frozen ``Settings``.
Environment variables win over the file. Secrets (the Redis URL may hold a
password) are ``SecretStr`` and print masked.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from broker.engines import check_engine_groups

DEFAULT_BANDS = ("interactive", "default", "batch")
# Model names become Redis Cluster hash tags and URL path parts: no braces, no spaces.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# How preemption may take a streamed answer back mid-way (``ModelConfig.resume_streams``).
ResumeStreams = Literal["exact", "text", "off"]

# Seed defaults: the engine queue each band may fill; batch only when the queue is empty.
DEFAULT_QUEUE_TARGETS = {"interactive": 3, "default": 3, "batch": 1}
_FALLBACK_QUEUE_TARGET = 3


# A DNS name: dot-separated labels of letters, digits and hyphens (a trailing dot allowed).
_DNS_NAME = re.compile(r"^(?=.{1,253}\.?$)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9])?\.?)+$")


class DiscoveryConfig(_Frozen):
    """A model's replicas found through DNS (``dispatcher.discovery``): every A and AAAA
    record of ``dns`` is one endpoint, ``scheme://address:port``. A Kubernetes headless
    Service has one record per ready pod, so no API permissions are needed."""

    dns: str
    port: int = Field(ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(default=5.0, gt=0)  # how often the records are read again
    # ... and while the model has queued requests and no healthy endpoint (a model waking
    # from zero): its first replica is found this soon after its record appears.
    waking_interval_s: float = Field(default=0.1, gt=0)
    # "host:port" (or a bare address: port 53) of the DNS servers to ask; empty: the
    # system's resolver configuration (/etc/resolv.conf).
    nameservers: tuple[str, ...] = ()

    @field_validator("dns")
    @classmethod
    def _valid_dns(cls, name: str) -> str:
        if not _DNS_NAME.match(name):
            raise ValueError(
                f"dns {name!r} must be a DNS name, such as engine-llama.fairq.svc.cluster.local"
            )
        return name

    @field_validator("nameservers")
    @classmethod
    def _valid_nameservers(cls, servers: tuple[str, ...]) -> tuple[str, ...]:
        for server in servers:
            nameserver_address(server)
        return servers


def nameserver_address(server: str) -> tuple[str, int]:
    """``"10.0.0.10"``, ``"10.0.0.10:53"`` or ``"[fd00::a]:53"`` as (address, port)."""
    host, port = server, "53"
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        port = rest.removeprefix(":") or port
    elif server.count(":") == 1:
        host, port = server.split(":")
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise ValueError(
            f"nameserver {server!r} must be an IP address with an optional port: "
            "10.0.0.10, 10.0.0.10:53 or [fd00::a]:53"
        )
    return host, number


class ModelConfig(_Frozen):
    """One served model and the engine pods (endpoints) that serve it: listed in
    ``endpoints``, found through ``discovery``, or both (the union). Models that list the
    same endpoints (or follow the same DNS name) are names of one engine, counted once for
    all of them (``broker.engines``)."""

    name: str
    # The engine's kind. Its /metrics are read by the names found on the page whatever this
    # says; the kind decides the rest: "vllm" gets fairq's job id as request_id and may
    # resume a cut stream (both vLLM-only); "sglang", "tgi" and "llamacpp" get plain
    # OpenAI-compatible requests and metrics admission; "openai" (a server without metrics
    # fairq reads) gets the static in-flight cap unless ``admission`` says otherwise.
    engine: Literal["vllm", "sglang", "tgi", "llamacpp", "openai"] = "vllm"
    endpoints: tuple[str, ...] = ()
    discovery: DiscoveryConfig | None = None
    # "metrics": backpressure from the engine's /metrics; "static": the in-flight cap only
    # (default for engine "openai", which has no metrics fairq can read).
    admission: Literal["metrics", "static"] | None = None
    queue_targets: dict[str, int] = Field(default_factory=dict)  # band -> engine queue target
    tpot_ceiling_ms: float = Field(default=150.0, gt=0)
    inflight_cap: int = Field(default=8, ge=1, description="static cap per endpoint")
    policy: Literal["round_robin", "token_fair"] = "round_robin"
    # token_fair: a job's service = prompt tokens x prompt cost + output tokens x output cost,
    # estimated at dispatch (output: max_tokens, else default_output_tokens), then corrected.
    prompt_token_cost: float = Field(default=1.0, ge=0)
    output_token_cost: float = Field(default=2.0, ge=0)
    default_output_tokens: int = Field(default=256, ge=1)
    # The engine runs vLLM's --scheduling-policy priority: send each request a priority.
    engine_priority: bool = False
    # The engine's batch per endpoint: requests it runs at once (vLLM's --max-num-seqs).
    # Users with a job in the engine are admitted only into free batch slots, so the engine's
    # own queue never holds theirs and whoever fairq picks next is next in the engine too.
    # None: learned from the metrics (the most requests it ran while others waited);
    # 0: no batch rule (the queue targets alone).
    batch_slots: int | None = Field(default=None, ge=0)
    # Batch slots kept for users with nothing in the engine, so that a newcomer never waits
    # for someone else's generation to end. None: one per full 32 slots (a batch of fewer
    # keeps none: its newcomer waits for the next free slot, at the head of the engine's queue).
    reserved_slots: int | None = Field(default=None, ge=0)
    # When a user with nothing in the engine finds no free batch slot, take a job of the user
    # with the most jobs there back out of the engine (one that has sent no output yet: it
    # starts again later, nothing repeated), so the newcomer gets its slot at the next step.
    preemption: bool = True
    # Keep a newcomer's prefill step clear of the flood's refills: for two engine steps (the
    # engine's recent time per output token) after a newcomer is sent to an endpoint, users
    # already in the engine send nothing more there, and with ``preemption`` their streamed
    # jobs handed over within those steps without output are taken back (they would share
    # its prefill step, which their prompts lengthen). Needs the batch rule and metrics
    # (dispatcher.newcomer_step).
    clear_newcomer_step: bool = True
    # Pace the refills of users already in the engine: as many per engine step as requests
    # end in one (at least one), spread over the step, rather than a burst whenever slots
    # free. The engine prefills what it got since its last step in one step; a burst makes
    # that step long, and a newcomer arriving then waits it out. Needs the batch rule and
    # metrics (``dispatcher.pacing``).
    pace_refills: bool = True
    # Ask the engine to stream the answers of requests whose clients want them whole (not
    # streamed), and rebuild each whole answer in the worker (``workers.whole``): fairq then
    # sees their first token at once, as a streamed request's, where it would otherwise see
    # nothing until the answer ends (admission, the newcomer's step and preemption rely on
    # it). Requests with fields the rebuild does not cover (tools, log probabilities, echo,
    # several choices, ...; ``broker.requests.WHOLE_FIELDS``) go to the engine as sent.
    stream_from_engine: bool = True
    # Preemption may also take a streamed answer back mid-way (vLLM only), to go on later
    # (``workers.resume_exact``). "exact": only an answer whose token ids the engine
    # returned (vLLM's return_token_ids): it goes on from the prompt's and the answer's
    # token ids, token for token. "text": also one without them, from the text sent (the
    # engine tokenises it anew, so the count of its tokens can be off by a few). "off":
    # never. YAML's true and false, the setting's old values, read as "text" and "off".
    resume_streams: ResumeStreams = "exact"
    # Which endpoint with room a job goes to: "least_loaded" (the most room) or "prefix"
    # (each user's jobs to one replica, where its prefix cache holds their conversation,
    # while that replica's jobs in flight stay within routing_load_bound x the mean:
    # dispatcher.affinity). With several replicas "prefix" sends no job express (each
    # waits for one dispatcher round). Set "prefix" for chat and agent traffic; the default
    # suits prompts that share nothing, where "prefix" only costs (docs/performance.md).
    routing: Literal["least_loaded", "prefix"] = "least_loaded"
    routing_load_bound: float = Field(default=1.25, ge=1.0)

    @field_validator("resume_streams", mode="before")
    @classmethod
    def _resume_from_bool(cls, value: object) -> object:
        if isinstance(value, bool):
            return "text" if value else "off"
        return value

    @property
    def admission_policy(self) -> str:
        return self.admission or ("static" if self.engine == "openai" else "metrics")

    def queue_target(self, band: str) -> int:
        if band in self.queue_targets:
            return self.queue_targets[band]
        return DEFAULT_QUEUE_TARGETS.get(band, _FALLBACK_QUEUE_TARGET)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        if not _MODEL_NAME.match(name):
            raise ValueError(
                f"model name {name!r} must start with a letter or digit and use only "
                "letters, digits and . _ : / @ + - (at most 200 characters)"
            )
        return name

    @field_validator("endpoints")
    @classmethod
    def _valid_endpoints(cls, endpoints: tuple[str, ...]) -> tuple[str, ...]:
        for url in endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"endpoint {url!r} must be an http:// or https:// base URL")
        return tuple(url.rstrip("/") for url in endpoints)

    @model_validator(mode="after")
    def _some_endpoints(self) -> ModelConfig:
        if not self.endpoints and self.discovery is None:
            raise ValueError(
                f"model {self.name!r} needs endpoints (a list of base URLs), discovery "
                "(a DNS name whose records are its replicas), or both"
            )
        return self


class ApiKeyConfig(_Frozen):
    """An API key, stored as the SHA-256 of the key (``fairq hash-key``)."""

    sha256: str
    user: str = Field(min_length=1, max_length=200)
    tenant: str | None = None
    weight: float = Field(default=1.0, gt=0)
    bands: tuple[str, ...] | None = None  # None: every band; the first is the default
    models: tuple[str, ...] | None = None  # None: every model
    admin: bool = False
    trusted_app: bool = False  # may name end users with OpenAI's `user` field

    @field_validator("sha256")
    @classmethod
    def _valid_hash(cls, value: str) -> str:
        if not _SHA256.match(value):
            raise ValueError("sha256 must be 64 lowercase hex digits (see `fairq hash-key`)")
        return value


class BatchSettings(_Frozen):
    """The Batch API (``broker/batch``): files, batches and the RQ batch workers."""

    # 200 MB, OpenAI's own limit. Files live in Redis: each costs about its size in memory.
    max_file_bytes: int = Field(default=200 * 1024 * 1024, ge=1024)
    max_lines: int = Field(default=50_000, ge=1)  # per batch file, OpenAI's limit
    # Batch lines are queued in band "batch" under this cap, not max_queued_per_user:
    # a 50,000-line batch must not be refused by the interactive cap (and cannot reach it).
    max_queued_lines_per_user: int = Field(default=1_000_000, ge=1)
    # A finished batch line's job record and result are kept this long (instead of
    # result_ttl_s) so that the batch can collect them even after a long batch-worker outage.
    line_keep_s: int = Field(default=3 * 86400, ge=60)
    completion_windows: dict[str, int] = Field(default_factory=lambda: {"24h": 86400})
    ingest_chunk_lines: int = Field(default=500, ge=1)
    harvest_window: int = Field(default=512, ge=1)  # lowest pending lines checked per pass
    sweep_interval_s: int = Field(default=1, ge=1)  # how often a batch worker advances batches
    lease_s: int = Field(default=15, ge=2)  # a dead batch worker's batch is retaken after this
    # Steps of a batch that may raise in a row: each waits twice as long as the one before
    # (from sweep_interval_s, at most a minute); then the batch fails with the error.
    step_max_tries: int = Field(default=8, ge=1)
    read_block_bytes: int = Field(default=1 << 20, ge=1024)


class HttpSettings(_Frozen):
    """The gateway's HTTP connections (``gateway/connections.py``): what one client may hold."""

    # A request's headers must all arrive within this, counted from the connection (or
    # from a keep-alive request's first byte): 408, then closed. A connection that sends
    # nothing at all is closed without an answer.
    header_timeout_s: float = Field(default=10.0, gt=0)
    # Longest silence while a request body arrives: 408, then closed.
    body_timeout_s: float = Field(default=30.0, gt=0)
    # An idle keep-alive connection is closed after this. It must outlast the idle expiry
    # of the clients' pools (httpx and the OpenAI SDK: 5 s, aiohttp 15 s, Go 90 s) and of
    # proxies in front (nginx upstreams, AWS ALB: 60 s): a server that closes first races
    # the client's next request on that connection, which then fails.
    keep_alive_s: float = Field(default=120.0, gt=0)
    # Open connections per gateway process, idle keep-alive ones included; one more reads
    # its request, gets a 503 (too_many_connections, Retry-After: 1) and is closed.
    max_connections: int = Field(default=2048, ge=1)
    # A body still arriving after its answer (a 413 sent on the declared length, or that
    # 503) is read and dropped up to this many bytes, so that a client that sends its whole
    # body before it reads gets the answer; beyond it the connection is closed.
    discard_body_bytes: int = Field(default=64 << 20, ge=0)


class Settings(BaseSettings):
    """All of fairq's configuration; units are in the names."""

    model_config = SettingsConfigDict(
        env_prefix="FAIRQ_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    redis_url: SecretStr | None = None
    # The URL names one node of a Redis Cluster (any node: the client finds the others).
    # See docs/operations.md, "Redis Cluster": the Batch API needs a single Redis.
    redis_cluster: bool = False
    # Per process; more wait their turn. Redis runs one command at a time, so more
    # connections add no throughput; 48 keeps a gateway under 50 with its reader.
    redis_max_connections: int = Field(default=48, ge=4)
    redis_pool_timeout_s: float = Field(default=10.0, gt=0)
    # The gateway's bound on one Redis command off the streaming hot path (job status,
    # cancel, resume, admin, files): a Redis that takes connections but does not answer
    # (stopped, or stuck in a long script) gets its callers a 503, not a hang. The hot
    # path's lean connection bounds its own round trips (broker/redis/resp.py).
    redis_command_timeout_s: float = Field(default=5.0, gt=0)
    bands: tuple[str, ...] = DEFAULT_BANDS
    models: tuple[ModelConfig, ...] = ()
    api_keys: tuple[ApiKeyConfig, ...] = ()

    max_queued_per_user: int = Field(default=1000, ge=1)
    queue_full_retry_after_s: int = Field(default=5, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    http: HttpSettings = Field(default_factory=HttpSettings)
    result_ttl_s: int = Field(default=3600, ge=1)
    ready_stream_maxlen: int = Field(default=100_000, ge=1000)

    dispatcher_idle_tick_s: float = Field(default=1.0, gt=0)
    # A dispatcher owns each of its models for this long unless it renews (every third).
    dispatcher_lease_ms: int = Field(default=3000, ge=100)
    # How long an express grant lasts (refreshed at half that while idle); 0: none.
    express_grant_ttl_s: float = Field(default=2.0, ge=0)
    scrape_interval_s: float = Field(default=0.2, gt=0)
    # The share of an engine's time its /metrics page may take for fairq's scrapes: an
    # endpoint is read again no sooner than its last read's time over this, and never less
    # often than every half of metrics_stale_s (dispatcher/scraper.py; a vLLM API server
    # renders its page on the process that streams tokens).
    scrape_budget: float = Field(default=0.02, gt=0, le=1)
    scrape_timeout_s: float = Field(default=1.0, gt=0)
    metrics_stale_s: float = Field(default=2.0, gt=0)  # older metrics: fall back to the cap
    unhealthy_after_failures: int = Field(default=2, ge=1)
    worker_concurrency: int = Field(default=64, ge=1)
    worker_drain_timeout_s: float = Field(default=30.0, ge=0)
    # Longest a streamed chunk waits to share a Redis write with other jobs' (workers/writer.py).
    stream_linger_ms: float = Field(default=2.0, ge=0)
    # Net allocations between young garbage collections in the long-running processes
    # (broker/process/gc_tuning.py); 0 keeps CPython's defaults (700, and nothing frozen).
    gc_young_threshold: int = Field(default=50_000, ge=0)
    engine_connect_timeout_s: float = Field(default=5.0, gt=0)
    engine_read_timeout_s: float = Field(default=300.0, gt=0)

    # Guarantees (workers/lease.py, workers/deadlines.py, workers/runner.py).
    # A running job's ready entry is leased to its worker: the worker renews every
    # lease_renew_ms; an entry idle for lease_ms is reclaimed by another worker.
    lease_ms: int = Field(default=15_000, ge=100)
    lease_renew_ms: int = Field(default=3_000, ge=20)
    # A worker that stopped or died leaves its name in each ready group; a name idle this
    # long with nothing pending is removed (workers/lease.py), each worker looking for such
    # names every forget_every_ms.
    forget_consumer_after_ms: int = Field(default=3_600_000, ge=1000)
    forget_every_ms: int = Field(default=60_000, ge=100)
    # Attempts of a job whose worker died before its first token; then dead letter.
    job_max_attempts: int = Field(default=3, ge=1)
    # Calls of the engine per attempt when it fails before the first token (5xx, refused,
    # silent): retried after retry_backoff_ms x 2^(n-1).
    engine_max_tries: int = Field(default=3, ge=1)
    retry_backoff_ms: float = Field(default=250.0, ge=0)
    # Times a job may be handed back for another endpoint when its tries all failed before
    # the engine took it (no connection, cut before the answer, 503: a replica going away);
    # past them it fails. 0: never handed back (workers/runner.py).
    engine_max_reroutes: int = Field(default=3, ge=0)
    # A streamed engine response silent this long is a hang (a non-streamed one gets
    # engine_read_timeout_s, as its body comes only at the end).
    engine_stream_idle_timeout_s: float = Field(default=60.0, gt=0)
    # Band -> seconds a job may wait in the queue before it ends "expired" (no entry: never;
    # the defaults name the default bands and are ignored for bands that do not exist).
    queue_deadline_s: dict[str, float] = Field(
        default_factory=lambda: {"interactive": 600.0, "default": 3600.0}
    )
    deadline_sweep_s: float = Field(default=1.0, gt=0)
    # A streaming client that leaves after output began may resume (Last-Event-ID) this
    # long before its job is cancelled.
    stream_resume_grace_s: float = Field(default=2.0, ge=0)

    # Prometheus /metrics of the dispatcher, the worker and the batch worker (the gateway
    # serves it on its own HTTP port). None: each component's own port (dispatcher 9464,
    # worker 9465, batch worker 9466), or a free one, logged, when another process on the
    # host holds it (broker.telemetry.serve_metrics); 0: no metrics server.
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    # Loopback: only this host reads them. Kubernetes pods set 0.0.0.0 (deploy/k8s/base),
    # so that Prometheus can reach them.
    metrics_host: str = "127.0.0.1"
    status_interval_s: float = Field(default=1.0, gt=0)  # dispatcher status snapshot period
    status_top_users: int = Field(default=10, ge=0)  # per-user series and status rows, per band
    batch: BatchSettings = Field(default_factory=BatchSettings)

    @model_validator(mode="after")
    def _check_references(self) -> Settings:
        if len(set(self.bands)) != len(self.bands) or not self.bands:
            raise ValueError("bands must be a non-empty list of distinct names")
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError("model names must be unique")
        # Models served by one engine (broker.engines): it must be named alike by each.
        check_engine_groups(self.models, self.bands)
        for key in self.api_keys:
            for band in key.bands or ():
                if band not in self.bands:
                    raise ValueError(f"api key of user {key.user!r} names unknown band {band!r}")
        return self

    @model_validator(mode="after")
    def _check_guarantees(self) -> Settings:
        named = "queue_deadline_s" in self.model_fields_set
        for band, limit in self.queue_deadline_s.items():
            if limit <= 0 or (named and band not in self.bands):
                raise ValueError(
                    f"queue_deadline_s names band {band!r}: it must be one of the bands "
                    f"({', '.join(self.bands)}) with a positive number of seconds"
                )
        if self.lease_renew_ms * 2 > self.lease_ms:
            raise ValueError(
                f"lease_renew_ms ({self.lease_renew_ms}) must be at most half of lease_ms "
                f"({self.lease_ms}), or a live worker could lose its jobs between renewals"
            )
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

    def model(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

    def require_redis_url(self) -> str:
        if self.redis_url is None:
            raise ValueError(
                "FAIRQ_REDIS_URL is not set: point it at your Redis (redis://host:6379/0), "
                "or start a private one: `fairq redis` prints its URL (`fairq up` starts "
                "one with the whole stack)"
            )
        return self.redis_url.get_secret_value()


def load_settings(**overrides: object) -> Settings:
    """Read and validate the configuration once; raises a readable error on bad input."""
    config_path = os.environ.get("FAIRQ_CONFIG")
    if config_path and not Path(config_path).is_file():
        raise FileNotFoundError(f"FAIRQ_CONFIG names {config_path!r}, which is not a file")
    return Settings(**overrides)  # type: ignore[arg-type]
