"""OpenAI's ``service_tier`` as fairq's bands (pure, no I/O): the band a request's tier
queues it in, and the tier a response says it was served in.

The mapping is the ``service_tiers`` setting, tier -> band, where null stands for the
key's own default band. A request's band (``request_band``), in this order:

1. A band named by the caller (the ``X-Fairq-Band`` header, the Python client's
   ``band=``) wins: it is fairq's own, explicit control, and stays strict (a band the
   key may not use is a 403, ``Principal.band_for``). The request's ``service_tier`` is
   still checked, so a bad value is never accepted silently.
2. Else its ``service_tier``: absent, or a tier mapped to null, is the key's default
   band. A tier's band the key may use is that band; one it may not is served in the
   key's allowed band nearest to it (the higher of two as near), as OpenAI serves a
   tier a project may not use in one it may, rather than refusing the request. So with
   the defaults ``priority`` runs in the key's highest band and ``flex`` in its lowest.
3. A tier the mapping does not name is the request's error (400, ``param``
   ``service_tier``), with the accepted ones in its message.

A response says the tier of the band the job ran in (``ServiceTiers.tier_of``): the
first tier mapped to that band, never ``auto`` (a request's value only, as at OpenAI);
``default`` for a band that no tier names, such as band ``default`` itself. That is a
fact about the band alone: a request without a ``service_tier`` from a key whose default
band is ``interactive`` is answered ``priority``, as that is how it was served.

The defaults name the default bands; where the bands are others, a tier whose band is
not one of them is not offered (``fairq config check`` holds a mapping that is set to
the bands that exist).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from broker.auth import Principal
from broker.errors import InvalidRequest

if TYPE_CHECKING:
    from broker.settings import Settings

_REQUEST_ONLY = "auto"  # OpenAI never answers "auto": it says the tier it chose
UNNAMED_BAND_TIER = "default"  # what a response of a band no tier names says
_MAX_SHOWN = 40  # of a value the caller sent, in an error message


class ServiceTiers:
    """The ``service_tiers`` setting over the configured bands, built once per process."""

    __slots__ = ("_bands", "_rank", "_said", "bands")

    def __init__(self, tiers: Mapping[str, str | None], bands: Sequence[str]) -> None:
        self.bands = tuple(bands)  # every band, the highest first
        self._rank = {band: rank for rank, band in enumerate(bands)}  # 0: the highest
        self._bands = {t: b for t, b in tiers.items() if b is None or b in self._rank}
        self._said = {band: self._first_tier(band) for band in bands}

    @classmethod
    def of(cls, settings: Settings) -> ServiceTiers:
        """The deployment's tiers: its ``service_tiers`` over its ``bands``."""
        return cls(settings.service_tiers, settings.bands)

    @property
    def names(self) -> tuple[str, ...]:
        """The tiers a request may name, in the setting's order."""
        return tuple(self._bands)

    def band(self, tier: str | None, allowed: Sequence[str]) -> str:
        """The band of a request with ``tier`` from a key allowed ``allowed`` (its default
        first); InvalidRequest for a tier not in the mapping."""
        if tier is None:
            return allowed[0]
        if tier not in self._bands:
            raise self._unknown(tier)
        target = self._bands[tier]
        if target is None:
            return allowed[0]
        if target in allowed:
            return target
        at = self._rank[target]
        return min(allowed, key=lambda band: (abs(self._rank[band] - at), self._rank[band]))

    def tier_of(self, band: str) -> str:
        """The tier a response of a job that ran in ``band`` says."""
        return self._said.get(band, UNNAMED_BAND_TIER)

    def _first_tier(self, band: str) -> str:
        named = (t for t, b in self._bands.items() if b == band and t != _REQUEST_ONLY)
        return next(named, UNNAMED_BAND_TIER)

    def _unknown(self, tier: str) -> InvalidRequest:
        shown = tier if len(tier) <= _MAX_SHOWN else tier[:_MAX_SHOWN] + "..."
        accepted = ", ".join(repr(t) for t in self._bands) or "none in this deployment"
        return InvalidRequest(
            f"Invalid value for service_tier: {shown!r}. Supported values are: {accepted}.",
            param="service_tier",
            code="invalid_value",
        )


def request_band(caller: Principal, band: str | None, tier: str | None, tiers: ServiceTiers) -> str:
    """The band a request queues in: ``band``, the caller's explicit one, if given (400 if
    it is no band, 403 if not the key's), else its ``tier``'s (see the module's
    docstring). The tier is checked either way."""
    by_tier = tiers.band(tier, caller.bands)
    return caller.band_for(band, tiers.bands) if band else by_tier
