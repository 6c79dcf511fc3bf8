"""The one way tests configure fairq: ``make_config()`` is the dict a stack's processes read
(as YAML, or a subprocess as its repr), ``make_settings()`` the validated ``Settings`` of it.

The default is one model at an endpoint where nothing listens, and three keys (alice,
bob, admin). A test's own configuration is overrides at its call site: Settings fields
by name (``models=[...]`` and ``api_keys=[...]`` replace the defaults whole), fields of
the one model in ``model_fields``. ``quick=True`` is for a dispatcher and workers that
must act in seconds: ``QUICK``'s small leases and timeouts, and the static admission
that does not wait for an engine's metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from broker import Settings, hash_key

MODEL = "m1"
ENDPOINT = "http://127.0.0.1:9"  # the discard port: nothing answers there
ALICE_KEY, BOB_KEY, ADMIN_KEY = "k-alice", "k-bob", "k-admin"
ALICE = {"Authorization": f"Bearer {ALICE_KEY}"}
BOB = {"Authorization": f"Bearer {BOB_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}

# Small leases and timeouts (quick=True), so each test of a running stack takes seconds.
QUICK: dict[str, Any] = {
    "lease_ms": 800,
    "lease_renew_ms": 150,
    "retry_backoff_ms": 20.0,
    "engine_max_tries": 3,
    "engine_stream_idle_timeout_s": 30.0,
    "engine_read_timeout_s": 30.0,
    "worker_drain_timeout_s": 1.0,
    "stream_resume_grace_s": 1.0,
    "deadline_sweep_s": 0.1,
    "scrape_interval_s": 0.05,
}


# Model fields that let a test's requests ask the simulator for a fault (``sim_fault``:
# sim/_faults.py), a field fairq refuses by default (broker.engine_fields).
SIM_FAULTS: dict[str, Any] = {"allow_fields": ["sim_fault"]}


def api_key(key: str, user: str, **fields: Any) -> dict[str, Any]:
    """One ``api_keys`` entry: ``key`` as configured, that is as its SHA-256."""
    return {"sha256": hash_key(key), "user": user, **fields}


API_KEYS = (
    api_key(ALICE_KEY, "alice"),
    api_key(BOB_KEY, "bob"),
    api_key(ADMIN_KEY, "admin", admin=True),
)


def make_config(
    endpoints: Sequence[str] = (ENDPOINT,),
    *,
    model: str = MODEL,
    model_fields: Mapping[str, Any] | None = None,
    quick: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """One ``model`` served at ``endpoints``, the keys of ``API_KEYS``, then ``overrides``."""
    admission = {"admission": "static"} if quick else {}
    entry = {"name": model, "endpoints": list(endpoints), **admission, **(model_fields or {})}
    keys = [dict(key) for key in API_KEYS]
    return {"models": [entry], "api_keys": keys, **(QUICK if quick else {}), **overrides}


def make_settings(
    redis_url: str | None = None, endpoints: Sequence[str] = (ENDPOINT,), **overrides: Any
) -> Settings:
    """``make_config(endpoints, **overrides)`` validated, with Redis at ``redis_url``
    (``make_settings(url, **config)`` validates a whole ``config``: it replaces every default)."""
    return Settings(redis_url=redis_url, **make_config(endpoints, **overrides))
