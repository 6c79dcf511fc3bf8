"""The RQ baseline's job: one non-streamed completion posted to the engine (importable by
RQ workers by name, as RQ jobs must be)."""

from __future__ import annotations

from typing import Any

import httpx


def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    # The simulator speaks plain HTTP on loopback: no TLS context. httpx builds one for every
    # client, loading the CA bundle (~50 ms of CPU), and RQ's work horse is a fresh fork
    # for every job, so with it RQ measured that load rather than its own queueing.
    response = httpx.post(url, json=body, timeout=60, verify=False)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result
