"""KEDA's rules for one ScaledObject, as ``fairq k8s render`` writes it (``fairq.k8s.engines``),
applied to a model's demand: how many replicas it should have now. Pure, no I/O.

The rendered ScaledObject has one Prometheus trigger on ``max(fairq_model_demand{model})``,
``metricType: AverageValue`` with ``threshold`` = the demand one replica takes, and
``activationThreshold: "0"``; ``minReplicaCount`` 0; ``cooldownPeriod`` and the HPA's
scale-down ``stabilizationWindowSeconds`` both the scale-down time, one pod per
``periodSeconds``. What KEDA and the HPA then do, and what this module does:

* activation: demand above 0 makes the ScaledObject active; KEDA scales 0 -> 1 at once;
* the HPA (1..N while active): desired = ceil(demand / threshold) (an AverageValue
  target over the metric's total), within [1, max]; a scale-up is applied at once;
* scale-down 1..N: the HPA takes the highest desired count over the stabilization
  window and removes at most one replica per period;
* to zero: KEDA scales the target to 0 once the trigger has been inactive (demand 0)
  for ``cooldownPeriod``.

The HPA's 10 % tolerance is left out: at the few replicas per model of this benchmark
it would never apply (one replica more or less is always a change above 10 %).

With the external-push trigger (``fairq keda-scaler``) the same rules hold, fed by its
calls instead of a Prometheus query, and one more path wakes a model (``on_push``, as
KEDA's ``scaleHandler.startPushScalers`` hands each StreamIsActive message to
``RequestScale``): an "active" message scales a target at zero to one replica at once
and marks the object active; an "inactive" message is ignored (KEDA leaves the step to
zero to its polling loop, after the cooldown).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rules:
    demand_per_replica: float  # the trigger's threshold
    max_replicas: int
    cooldown_s: float  # cooldownPeriod, and the HPA's scale-down stabilization window
    scale_down_period_s: float  # one replica removed per this long (the HPA's policy)
    min_replicas: int = 0


@dataclass
class ModelScale:
    """What the rules remember of one model between polls."""

    last_active_s: float | None = None  # when the demand was last above 0
    recommendations: deque[tuple[float, int]] = field(default_factory=deque)  # (t, desired)
    last_scale_down_s: float = -math.inf


def hpa_desired(demand: float, rules: Rules) -> int:
    """The HPA's count for an AverageValue target, within [max(1, min), max]."""
    wanted = math.ceil(demand / rules.demand_per_replica) if demand > 0 else 0
    return max(1, rules.min_replicas, min(rules.max_replicas, wanted))


def target(
    state: ModelScale,
    demand: float,
    current: int,
    now_s: float,
    rules: Rules,
    *,
    active: bool | None = None,
) -> int:
    """The replica count the model should have at ``now_s``, given ``current`` (starting
    or ready; draining ones no longer count). ``active``: the trigger's activity when it
    is a call of its own (the external scaler's IsActive); else the demand above 0 (the
    Prometheus trigger's ``activationThreshold: "0"``). Updates ``state``."""
    if demand > 0 if active is None else active:
        state.last_active_s = now_s
    active = state.last_active_s is not None and now_s - state.last_active_s < rules.cooldown_s
    if not active:
        state.recommendations.clear()
        return rules.min_replicas
    desired = hpa_desired(demand, rules)
    state.recommendations.append((now_s, desired))
    while state.recommendations and state.recommendations[0][0] < now_s - rules.cooldown_s:
        state.recommendations.popleft()
    stable = max(d for _, d in state.recommendations)
    if stable >= current:
        return stable
    if now_s - state.last_scale_down_s < rules.scale_down_period_s:
        return current
    state.last_scale_down_s = now_s
    return current - 1


def on_push(state: ModelScale, active: bool, current: int, now_s: float, rules: Rules) -> int:
    """The replica count after one StreamIsActive message (module docstring): at zero, an
    "active" scales to ``max(1, min_replicas)`` at once; above zero it only marks the
    object active (KEDA's ``LastActiveTime``), the HPA keeps the count; "inactive" changes
    nothing. Updates ``state``."""
    if not active:
        return current
    state.last_active_s = now_s
    return max(1, rules.min_replicas) if current == 0 else current
