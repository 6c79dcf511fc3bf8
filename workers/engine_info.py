"""What a worker asks an engine besides running jobs: the context length of a model.

A chat answer without a token limit runs until the engine's context is full; to go on
with one exactly (``workers.resume_exact``) the worker needs that length. vLLM (and the
simulator) give it as ``max_model_len`` in ``GET /v1/models``. It is asked only when a
job is resumed, once per endpoint and model while the answer is known; an engine that
does not say is asked again after ``RETRY_S``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import httpx

log = logging.getLogger(__name__)

RETRY_S = 30.0
_TIMEOUT_S = 5.0


class ContextLengths:
    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        self._headers = dict(headers or {})  # the engine's API key (workers.engine)
        self._known: dict[tuple[str, str], int] = {}
        self._unknown_until: dict[tuple[str, str], float] = {}

    async def get(self, endpoint: str, model: str) -> int | None:
        """The model's context length at ``endpoint``; None when the engine does not say."""
        key = (endpoint, model)
        if key in self._known:
            return self._known[key]
        if self._unknown_until.get(key, 0.0) > time.monotonic():
            return None
        length = await _ask(endpoint, model, self._headers)
        if length is None:
            self._unknown_until[key] = time.monotonic() + RETRY_S
        else:
            self._known[key] = length
        return length


async def _ask(endpoint: str, model: str, headers: Mapping[str, str]) -> int | None:
    try:
        async with httpx.AsyncClient(timeout=_TIMEOUT_S, headers=headers) as client:
            reply = await client.get(f"{endpoint}/v1/models")
        reply.raise_for_status()
        listed = reply.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        log.warning("could not read the models of %s: %s", endpoint, exc)
        return None
    for entry in listed:
        if isinstance(entry, dict) and entry.get("id") == model:
            length = entry.get("max_model_len")
            return length if isinstance(length, int) and length > 0 else None
    return None
