"""The RQ baseline's job: one non-streamed completion posted to the engine (importable by
RQ workers by name, as RQ jobs must be)."""

from __future__ import annotations

from typing import Any

import httpx


def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url, json=body, timeout=60)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result
