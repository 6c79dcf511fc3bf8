"""The ``Idempotency-Key`` header of the routes that create work (``broker.idempotency``).

Chat and text completions, files and batches read it here; a route with it makes its
job, file or batch once per key and caller, and answers a retry with what the first try
made, saying so in ``Idempotent-Replayed: true``. A request without the header pays one
header look-up and nothing else.

``POST /v1/responses``, once fairq serves it, takes the key the same way: its route name
in ``broker.idempotency.ROUTES`` and ``openapi._IDEMPOTENT``, ``idempotency_key`` before
its body is read, then ``FollowedJob.submit_once`` with the key ``scoped`` to its route
(``completions._submit_once`` is the pattern).
"""

from __future__ import annotations

from fastapi import Request

from broker.auth import Principal
from broker.idempotency import HEADER, Idempotency, check_key
from gateway.body import single_header
from gateway.errors import REPLAYED_HEADER
from gateway.state import gateway_of


def idempotency_key(request: Request) -> str | None:
    """The request's key, checked (InvalidRequest, 400, when it is not one), or None."""
    why = "a key stands for one request"
    value = single_header(request, HEADER, why, "invalid_idempotency_key")
    return None if value is None else check_key(value)


def scoped(
    request: Request, caller: Principal, key: str, route: str, fingerprint: str
) -> Idempotency:
    """The key of ``caller`` (its API key's user) on ``route``, kept for the window."""
    window_s = gateway_of(request).settings.idempotency_window_s
    return Idempotency.of(
        key, owner=caller.user, route=route, fingerprint=fingerprint, window_s=window_s
    )


def replay_headers(replayed: bool) -> dict[str, str] | None:
    """The headers of an answer that is (or is not) an earlier try's, replayed."""
    return {REPLAYED_HEADER: "true"} if replayed else None
