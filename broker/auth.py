"""API keys to principals: who is asking, and what they may use.

Keys are configured as SHA-256 hashes, so the configuration never holds a key
in clear. The user is taken from the key, never from the request, except that a
key marked ``trusted_app`` may name its end users with OpenAI's ``user`` field
(one app serving many people still shares fairly among them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from broker.errors import Forbidden, InvalidRequest, Unauthorized
from broker.settings import ApiKeyConfig, Settings

_MAX_END_USER = 128
_MAX_SHOWN = 40  # of a value the caller sent, in an error message


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    user: str
    tenant: str
    weight: float
    bands: tuple[str, ...]
    models: tuple[str, ...] | None
    admin: bool
    trusted_app: bool

    def may_use_model(self, model: str) -> bool:
        return self.models is None or model in self.models

    def band_for(self, requested: str | None, known: Sequence[str]) -> str:
        """The band to queue in: the key's default, or a band the key is entitled to.
        A band that is not one of the ``known`` (configured) bands is the request's error
        (400); a band the key may not use, a refusal (403)."""
        if requested is None:
            return self.bands[0]
        if requested not in known:
            shown = requested if len(requested) <= _MAX_SHOWN else requested[:_MAX_SHOWN] + "..."
            raise InvalidRequest(
                f"unknown priority band {shown!r}; bands: {', '.join(known)}",
                code="unknown_band",
            )
        if requested not in self.bands:
            raise Forbidden(
                f"this API key may not use priority band {requested!r}; "
                f"allowed: {', '.join(self.bands)}"
            )
        return requested

    def end_user(self, requested: str | None) -> str:
        """The fairness unit of a request; only trusted apps may subdivide by end user."""
        if not self.trusted_app or not requested:
            return self.user
        if len(requested) > _MAX_END_USER:
            raise InvalidRequest(f"'user' is longer than {_MAX_END_USER} characters", param="user")
        return f"{self.user}/{requested}"


class KeyRing:
    """Looks up principals by API key; built once from the settings."""

    def __init__(self, settings: Settings) -> None:
        self._by_hash = {k.sha256: self._principal(k, settings) for k in settings.api_keys}

    @staticmethod
    def _principal(key: ApiKeyConfig, settings: Settings) -> Principal:
        return Principal(
            user=key.user,
            tenant=key.tenant or key.user,
            weight=key.weight,
            bands=key.bands or settings.bands,
            models=key.models,
            admin=key.admin,
            trusted_app=key.trusted_app,
        )

    def resolve(self, key: str | None) -> Principal:
        if not key:
            raise Unauthorized("missing API key: send it as 'Authorization: Bearer <key>'")
        # A dict lookup on the hash: timing can at most reveal a hash prefix, not the key.
        principal = self._by_hash.get(hash_key(key))
        if principal is None:
            raise Unauthorized("invalid API key")
        return principal
