"""Which models one engine serves: models that name the same engine share it (pure).

One vLLM often serves several names: a base model and its LoRA adapters
(``--lora-modules name=path``) or aliases (``--served-model-name a b``). Its queue and
batch are one, whatever name a request used, so fairq must count them once for all the
names (``dispatcher.service`` dispatches such models as one, in turn).

The configuration describes an engine once, in ``engines``, and each model names it
(``broker.settings.resolve`` copies the engine's settings onto each). Models are grouped
here by where their engine is all the same: models that list the same endpoint URL, or
follow the same DNS name (same port and scheme), share that engine, so that the old form
(each model listing its engine's place and settings itself) is counted right as it
stands. Such models must then name it whole and alike: the same endpoints and the same
discovery (a model that shared only some would make one queue of several engines), and
the same engine-wide settings (``ENGINE_WIDE``: the engine's kind, its queue targets,
batch, caps, preemption and routing: one engine has one of each); models naming one
entry of ``engines`` agree by construction. What stays per model: its name and users,
its fairness policy and token costs, ``default_output_tokens``, ``stream_from_engine``
and ``resume_streams``. A disagreement raises ``SettingError`` at the later model's
setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from broker.errors import SettingError


class _Discovery(Protocol):
    @property
    def dns(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def scheme(self) -> str: ...


class EngineModel(Protocol):
    """What this module reads of a model or an engine (``broker.settings.ModelConfig``,
    ``EngineConfig``; the settings import this module: hence a shape, not the classes)."""

    @property
    def name(self) -> str: ...
    @property
    def endpoints(self) -> tuple[str, ...]: ...
    @property
    def discovery(self) -> _Discovery | None: ...
    def queue_target(self, band: str) -> int: ...


M = TypeVar("M", bound=EngineModel)

# Settings of one engine: models that share it must agree on each of them.
ENGINE_WIDE = (
    "engine",
    "admission_policy",
    "tpot_ceiling_ms",
    "inflight_cap",
    "batch_slots",
    "reserved_slots",
    "preemption",
    "clear_newcomer_step",
    "pace_refills",
    "engine_priority",
    "routing",
    "routing_load_bound",
)


def engine_groups(models: Sequence[M]) -> tuple[tuple[M, ...], ...]:
    """The models grouped by the engine they share, in configuration order (a model that
    shares with none is a group of one). Raises ``SettingError`` naming the models when
    models share an engine but name it differently, or disagree on an engine-wide
    setting; ``bands`` are checked by ``check_engine_groups``."""
    groups: list[list[M]] = []
    for model in models:
        joined = [g for g in groups if any(share_engine(model, other) for other in g)]
        merged = [m for g in joined for m in g] + [model]
        groups = [g for g in groups if g not in joined]
        groups.append(sorted(merged, key=models.index))
    ordered = sorted(groups, key=lambda g: models.index(g[0]))
    for group in ordered:
        _same_engine(group, models)
    return tuple(tuple(g) for g in ordered)


def check_engine_groups(models: Sequence[EngineModel], bands: Sequence[str]) -> None:
    """``engine_groups``' checks, and that models sharing an engine have one queue target
    per band (the engine's queue is one)."""
    for group in engine_groups(models):
        first = group[0]
        for model in group[1:]:
            for band in bands:
                if model.queue_target(band) != first.queue_target(band):
                    raise SettingError(
                        ("models", models.index(model), "queue_targets", band),
                        _disagree(first, model, f"queue_targets[{band!r}]")
                        + f" ({first.queue_target(band)} against {model.queue_target(band)})",
                    )


def _discovered(model: EngineModel) -> tuple[str, int, str] | None:
    found = model.discovery
    if found is None:
        return None
    return found.dns.lower().rstrip("."), found.port, found.scheme


def share_engine(a: EngineModel, b: EngineModel) -> bool:
    """Whether ``a`` and ``b`` name an engine in common (an endpoint, or a DNS name)."""
    found = _discovered(a)
    return bool(set(a.endpoints) & set(b.endpoints)) or (
        found is not None and found == _discovered(b)
    )


def _same_engine(group: Sequence[EngineModel], models: Sequence[EngineModel]) -> None:
    first = group[0]
    for model in group[1:]:
        index = models.index(model)
        listed = set(model.endpoints) == set(first.endpoints)
        if not listed or _discovered(model) != _discovered(first):
            raise SettingError(
                ("models", index, "discovery" if listed else "endpoints"),
                f"models {first.name!r} and {model.name!r} share an engine (an endpoint or "
                "a discovery DNS name in common) but name it differently: models served by "
                "one engine must list the same endpoints and the same discovery "
                f"({first.name!r}: {_where(first)}; {model.name!r}: {_where(model)})",
            )
        for name in ENGINE_WIDE:
            if getattr(model, name) != getattr(first, name):
                setting = "admission" if name == "admission_policy" else name  # a property
                raise SettingError(
                    ("models", index, setting),
                    _disagree(first, model, name)
                    + f" ({getattr(first, name)!r} against {getattr(model, name)!r})",
                )


def _disagree(first: EngineModel, model: EngineModel, setting: str) -> str:
    return (
        f"models {first.name!r} and {model.name!r} share an engine, so they must agree on "
        f"{setting}: one engine has one"
    )


def _where(model: EngineModel) -> str:
    found = _discovered(model)
    listed = ", ".join(model.endpoints) or "none"
    return f"endpoints {listed}" + (f", discovery {found[0]}:{found[1]}" if found else "")
