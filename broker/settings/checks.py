"""The dependencies between settings, checked once where they load (``Settings``' last
validator): each raises a ``SettingError`` whose path is the setting to change, so that
``fairq config check`` names its line. What one entry alone decides is its class's own
check (``EngineConfig``, ``EngineSettings``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from broker.engines import check_engine_groups, share_engine
from broker.errors import SettingError
from broker.settings.engine import EngineConfig, EngineSettings
from broker.settings.keys import ApiKeyConfig
from broker.settings.model import ModelConfig
from broker.settings.quotas import QuotaConfig


class Checked(Protocol):
    """What these checks read of the settings (``broker.settings.root.Settings``, which
    calls them: hence a shape, not the class)."""

    @property
    def bands(self) -> tuple[str, ...]: ...
    @property
    def models(self) -> tuple[ModelConfig, ...]: ...
    @property
    def engines(self) -> tuple[EngineConfig, ...]: ...
    @property
    def api_keys(self) -> tuple[ApiKeyConfig, ...]: ...
    @property
    def service_tiers(self) -> Mapping[str, str | None]: ...
    @property
    def queue_deadline_s(self) -> Mapping[str, float]: ...
    @property
    def model_fields_set(self) -> set[str]: ...
    @property
    def lease_ms(self) -> int: ...
    @property
    def lease_renew_ms(self) -> int: ...
    @property
    def quotas(self) -> tuple[QuotaConfig, ...]: ...
    @property
    def redis_cluster(self) -> bool: ...


def check(settings: Checked) -> None:
    """Raises the first contradiction between ``settings``, or a name they use that they
    do not define."""
    _bands(settings.bands)
    _unique("models", [model.name for model in settings.models])
    _unique("engines", [engine.name for engine in settings.engines])
    _engines_apart(settings.engines)
    _queue_target_bands(settings)
    check_engine_groups(settings.models, settings.bands)
    _unique_keys(settings.api_keys)
    _key_bands(settings)
    _service_tiers(settings)
    _queue_deadlines(settings)
    _leases(settings)
    _quotas(settings)


def _bands(bands: Sequence[str]) -> None:
    if len(set(bands)) != len(bands) or not bands:
        raise SettingError(("bands",), "must be a non-empty list of distinct names")


def _unique(section: str, names: Sequence[str]) -> None:
    for index, name in enumerate(names):
        if name in names[:index]:
            raise SettingError(
                (section, index, "name"),
                f"{name!r} is the name of {section}[{names.index(name)}] too: names of "
                f"{section} must be unique",
            )


def _engines_apart(engines: Sequence[EngineConfig]) -> None:
    for index, engine in enumerate(engines):
        for place, other in enumerate(engines[:index]):
            if share_engine(engine, other):
                listed = set(engine.endpoints) & set(other.endpoints)
                shared = "endpoints" if listed else "discovery"
                raise SettingError(
                    ("engines", index, shared),
                    f"engines {other.name!r} (engines[{place}]) and {engine.name!r} name one "
                    f"engine (their {shared} meet): describe it in one entry, and let every "
                    "model it serves name that one",
                )


def _queue_target_bands(settings: Checked) -> None:
    # An engine entry first: a model that names it carries its targets too, and the line
    # to change is the engine's.
    entries: list[tuple[str, int, EngineSettings]] = [
        *(("engines", i, e) for i, e in enumerate(settings.engines)),
        *(("models", i, m) for i, m in enumerate(settings.models)),
    ]
    for section, index, entry in entries:
        for band in entry.queue_targets:
            if band not in settings.bands:
                raise SettingError(
                    (section, index, "queue_targets", band),
                    f"{band!r} is not a band, so this target would never apply: the bands "
                    f"are {', '.join(settings.bands)}",
                )


def _unique_keys(api_keys: Sequence[ApiKeyConfig]) -> None:
    # One key is one user's: listed twice, the gateway would keep one entry and drop the
    # other's user, bands and models without a word.
    first: dict[str, int] = {}
    for index, key in enumerate(api_keys):
        if key.sha256 in first:
            place = first[key.sha256]
            raise SettingError(
                ("api_keys", index, "sha256"),
                f"the same key as api_keys[{place}] (user {api_keys[place].user!r}): list "
                "each key once; each user its own key (`fairq hash-key KEY`)",
            )
        first[key.sha256] = index


def _key_bands(settings: Checked) -> None:
    for index, key in enumerate(settings.api_keys):
        for place, band in enumerate(key.bands or ()):
            if band not in settings.bands:
                raise SettingError(
                    ("api_keys", index, "bands", place),
                    f"api key of user {key.user!r} names unknown band {band!r}: the bands "
                    f"are {', '.join(settings.bands)}",
                )


def _service_tiers(settings: Checked) -> None:
    # The defaults name the default bands: a tier of theirs whose band does not exist is not
    # offered (broker.tiers). A mapping the deployment wrote must name its bands.
    if "service_tiers" not in settings.model_fields_set:
        return
    for tier, band in settings.service_tiers.items():
        if not tier or (band is not None and band not in settings.bands):
            raise SettingError(
                ("service_tiers", tier),
                f"service tier {tier!r} must name one of the bands "
                f"({', '.join(settings.bands)}), or be null for the key's default band",
            )


def _queue_deadlines(settings: Checked) -> None:
    # The defaults name the default bands: ignored where those do not exist.
    named = "queue_deadline_s" in settings.model_fields_set
    for band, limit in settings.queue_deadline_s.items():
        if limit <= 0 or (named and band not in settings.bands):
            raise SettingError(
                ("queue_deadline_s", band),
                f"{band!r} must be one of the bands ({', '.join(settings.bands)}), with a "
                "positive number of seconds",
            )


def _leases(settings: Checked) -> None:
    renew, lease = settings.lease_renew_ms, settings.lease_ms
    if renew * 2 <= lease:
        return
    lost = "so a live worker could lose its jobs between renewals"
    if "lease_renew_ms" not in settings.model_fields_set:  # the line to change: lease_ms's
        raise SettingError(
            ("lease_ms",),
            f"{lease} is less than twice lease_renew_ms ({renew}, its default), {lost}: "
            f"a lease of at least {renew * 2} ms, or a shorter lease_renew_ms",
        )
    raise SettingError(
        ("lease_renew_ms",),
        f"{renew} is more than half of lease_ms ({lease}), {lost}: renew at most every "
        f"{lease // 2} ms",
    )


def _quotas(settings: Checked) -> None:
    tenants = {key.tenant or key.user for key in settings.api_keys}
    users = {key.user for key in settings.api_keys}
    seen: dict[str, int] = {}
    for index, quota in enumerate(settings.quotas):
        if settings.redis_cluster:
            # Its counters are shared by every model, and a cluster's script touches one slot.
            raise SettingError(
                ("quotas", index),
                "quotas need a single Redis: a tenant's counters are shared by all its "
                "models, and on a Redis Cluster each model's keys live in a slot of their "
                "own; remove the quotas, or run this deployment on a single Redis",
            )
        field, name, known = (
            ("tenant", quota.tenant, tenants) if quota.tenant is not None else
            ("user", quota.user, users)
        )  # fmt: skip
        if name not in known:
            raise SettingError(
                ("quotas", index, field),
                f"no API key has {field} {name!r}: its quota would never count a request",
            )
        if quota.scope in seen:
            raise SettingError(
                ("quotas", index, field),
                f"quotas[{seen[quota.scope]}] is the {quota.scope}'s too: give each one "
                "entry, with all its limits",
            )
        seen[quota.scope] = index
