"""What ``deploy/k8s/fairq.yaml`` says of the cluster and of each model's engines (its
``k8s`` blocks), validated; and the Kubernetes names a model's objects get."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ENGINE_PORT = 8000
SCALER_NAME = "keda-scaler"  # its Deployment and Service (fairq.k8s.scaler)
SCALER_PORT = 9467
_SLUG_MAX = 48  # "engine-" + slug stays within a Service name's 63 characters


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineSpec(_Strict):
    """A model's ``k8s`` block: how its engine pods run and scale."""

    hf_model: str | None = None  # what vLLM loads; default: the served model name
    # KEDA keeps the replicas within these bounds; 0: the model has no engine while
    # nothing of it is queued or in flight, and its first request wakes one.
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=1, ge=1, le=64)
    # Replicas = ceil(demand / this): the jobs (queued + in flight) one replica serves;
    # about the engine's batch (vLLM's --max-num-seqs) keeps its queue short.
    demand_per_replica: int = Field(default=32, ge=1)
    # A stopping pod waits this long at most for its requests to end (then is killed).
    drain_timeout_s: int = Field(default=600, ge=0)
    gpus: int = Field(default=1, ge=1)
    cpu: str = "4"
    memory: str = "32Gi"
    vllm_args: tuple[str, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _no_pods(cls, data: Any) -> Any:
        if isinstance(data, dict) and "pods" in data:
            raise ValueError(
                "k8s.pods is gone: engines scale with demand; set k8s.min_replicas and "
                "k8s.max_replicas (min_replicas: 0 lets the model scale to zero)"
            )
        return data

    @model_validator(mode="after")
    def _bounds(self) -> EngineSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"k8s.min_replicas ({self.min_replicas}) is above k8s.max_replicas "
                f"({self.max_replicas})"
            )
        return self


class ClusterSpec(_Strict):
    """The top-level ``k8s`` block."""

    namespace: str = "fairq"
    # The vLLM release fairq's engine claims are measured against (benchmarks/lib/vllm_engine,
    # its CPU build): its metrics are the ones admission reads. Releases before 0.11.0 fetch
    # media URLs a request names from inside the cluster (CVE-2025-6242).
    vllm_image: str = "vllm/vllm-openai:v0.32.0"
    fairq_image: str = "fairq:0.1.0"
    # KEDA: worker replicas = (running jobs over all models) / this; 48 is 3/4 of the
    # default worker_concurrency (64), so a worker is added before they are all full.
    worker_jobs_target: int = Field(default=48, ge=1)
    worker_min_replicas: int = Field(default=2, ge=1)
    worker_max_replicas: int = Field(default=20, ge=1)
    # Where KEDA's operator (another namespace) reaches Redis; default: the in-cluster one.
    keda_redis_address: str | None = None
    # Engines: what KEDA's trigger on each model's demand is. external-push: fairq's own
    # scaler (`fairq keda-scaler`, rendered into the base) reads the demand from Redis and
    # pushes a model's first job to KEDA at once. prometheus: KEDA polls the dispatchers'
    # fairq_model_demand in Prometheus (it must scrape them: components/prometheus), so a
    # model at zero wakes within a poll plus a scrape.
    engine_trigger: Literal["external-push", "prometheus"] = "external-push"
    keda_namespace: str = "keda"  # where KEDA's operator runs: it alone may call the scaler
    prometheus_address: str = "http://prometheus-operated.monitoring.svc.cluster.local:9090"
    # How often KEDA polls (the prometheus trigger's wake delay; with external-push, how
    # often KEDA reads the demand for the replicas above one), and how long demand must
    # stay low before replicas are removed.
    engine_polling_s: int = Field(default=5, ge=1)
    engine_scale_down_s: int = Field(default=300, ge=0)
    discovery_interval_s: float = Field(default=5.0, gt=0)  # how often fairq reads DNS

    def redis_address(self) -> str:
        return self.keda_redis_address or f"redis.{self.namespace}.svc.cluster.local:6379"

    def scaler_address(self) -> str:
        """Where KEDA's operator (another namespace) reaches ``fairq keda-scaler``."""
        return f"{SCALER_NAME}.{self.namespace}.svc.cluster.local:{SCALER_PORT}"


@dataclass(frozen=True)
class Model:
    name: str
    slug: str
    engine: EngineSpec

    @property
    def service(self) -> str:
        """The engine Deployment's and headless Service's name."""
        return f"engine-{self.slug}"

    def discovery(self, cluster: ClusterSpec) -> dict[str, Any]:
        """fairq's ``discovery`` of the model: the headless Service's records."""
        return {
            "dns": f"{self.service}.{cluster.namespace}.svc.cluster.local",
            "port": ENGINE_PORT,
            "scheme": "http",
            "interval_s": cluster.discovery_interval_s,
        }


def slug(name: str) -> str:
    """A DNS-label-safe form of a model name; a hash keeps a shortened name distinct."""
    base = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    if len(base) <= _SLUG_MAX:
        return base
    digest = hashlib.sha1(name.encode()).hexdigest()[:6]
    return f"{base[: _SLUG_MAX - 7].rstrip('-')}-{digest}"


def label_value(name: str) -> str:
    """The model name as a label value (``/`` and ``:`` are not allowed there)."""
    value = re.sub(r"[^A-Za-z0-9._-]", "-", name)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
