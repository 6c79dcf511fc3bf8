"""What a KEDA ScaledObject asks of fairq's external scaler, answered from plain values.

KEDA sends each call the trigger's ``metadata`` (``ScaledObjectRef.scalerMetadata``);
``fairq k8s render`` writes there the fairq model the engine serves (``model``) and the
demand one replica serves (``demandPerReplica``). A model's demand is what
``fairq_model_demand`` exports (``dispatcher.publisher``): its jobs queued in every band
plus its jobs in flight, read from the same two counters.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

METRIC = "fairq-demand"  # the one metric each trigger gets (KEDA prefixes its index)
MODEL_KEY = "model"
PER_REPLICA_KEY = "demandPerReplica"
SHOWN_CHARS = 64  # of a value the caller sent, in a refusal: a message, not an echo


class BadTrigger(ValueError):
    """A ScaledObject's trigger metadata this scaler cannot answer for (the message says
    what to change in it). The message names only what the caller sent, cut to
    ``SHOWN_CHARS``: never the models this scaler serves, which anyone who reaches the
    port could otherwise list by asking for one that is not."""


def shown(value: str) -> str:
    """A caller's value as a refusal quotes it: repr'd, cut to ``SHOWN_CHARS``."""
    cut = value[:SHOWN_CHARS]
    return repr(cut) + ("..." if len(value) > SHOWN_CHARS else "")


@dataclass(frozen=True)
class Target:
    model: str
    demand_per_replica: float  # KEDA's HPA: replicas = ceil(demand / this)


def target_of(metadata: Mapping[str, str], models: Collection[str]) -> Target:
    """The model and per-replica target a trigger names, checked against the models this
    scaler's configuration serves."""
    model = metadata.get(MODEL_KEY, "")
    if not model:
        raise BadTrigger(
            f"the trigger's metadata names no model: add `{MODEL_KEY}: <fairq model name>` "
            "(fairq k8s render writes it)"
        )
    if model not in models:
        raise BadTrigger(
            f"model {shown(model)} is not served by this scaler: fix the trigger's "
            f"`{MODEL_KEY}` or add the model to its FAIRQ_CONFIG"
        )
    raw = metadata.get(PER_REPLICA_KEY, "1")
    try:
        per_replica = float(raw)
    except ValueError:
        per_replica = 0.0
    if not per_replica > 0:
        raise BadTrigger(
            f"the trigger's `{PER_REPLICA_KEY}` is {shown(raw)}: it must be a number above 0 "
            "(the jobs queued and in flight one engine replica serves)"
        )
    return Target(model, per_replica)


def demand_of(queued: Mapping[bytes, bytes], inflight: Mapping[bytes, bytes]) -> int:
    """A model's demand from its queued-per-band and in-flight-per-endpoint counters. A
    band's count below zero (a decrement that raced its increment) counts as 0, as in
    ``broker.status.read_queues``."""
    waiting = sum(max(0, int(count)) for count in queued.values())
    return max(0, waiting + sum(int(count) for count in inflight.values()))
