"""The exception tree of fairq's broker and gateway.

Every error a caller can act on derives from ``FairqError`` and carries what the
gateway returns as OpenAI's error object (``message``, ``type``, ``param``,
``code``) plus the HTTP status. ``param`` names the request field at fault, as
OpenAI's does (``"max_tokens"``, ``"messages.[0].content"``), and is None when
no field is (a header, the whole body, the server)::

    FairqError                      500 internal_error
    ├── InvalidRequest              400 invalid_request_error
    ├── Unauthorized                401 invalid_api_key
    ├── NotFound                    404 not_found
    │   └── UnknownModel            404 model_not_found
    ├── Forbidden                   403 permission_denied
    ├── IdempotencyKeyReused        409 idempotency_key_reused (another request's key)
    ├── IdempotentResultGone        410 idempotent_result_expired (what the key made is gone)
    ├── BodyTooLarge                413 request_too_large
    ├── QueueFull                   429 queue_full (with retry_after_s)
    ├── OverQuota                   429 rate_limit_exceeded (with the quotas' reading)
    ├── NotSupported                501 not_supported (in this deployment)
    ├── BrokerUnavailable           503 redis_unavailable
    └── JobFailed                   the job's own status (502 by default)

redis-py errors are translated at the edge with ``raise ... from exc``.

Outside the tree, ``SettingError`` is a configuration that contradicts itself, found
where the settings are loaded: a ``ValueError``, as pydantic's validators raise, that
names the setting to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.quotas import Reading

SettingPath = tuple[str | int, ...]


def dotted(path: SettingPath) -> str:
    """A setting's path as a person writes it: ``models[0].batch_slots``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class SettingError(ValueError):
    """A setting that contradicts another (or names what does not exist). ``path`` is the
    setting to change, as pydantic names a field (``("models", 0, "batch_slots")``),
    relative to the settings object that raised it, so that ``fairq config check`` can
    name its line; the message says what is wrong and what to do, without the path."""

    def __init__(self, path: SettingPath, message: str) -> None:
        super().__init__(message)
        self.path = path


class FairqError(Exception):
    """Root of all fairq errors; subclasses fix the HTTP status and error type."""

    status = 500
    type = "internal_error"
    code: str | None = "internal_error"
    # True: a client should not send the request again by itself (the gateway says
    # ``x-should-retry: false``, which the openai clients honour; they retry a 408, a 409
    # and any 5xx otherwise). The same request would get the same answer, or one the
    # client asked for (a deadline of its own that passed).
    final = False

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_body(self) -> dict[str, dict[str, str | None]]:
        """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return {"error": error}


class InvalidRequest(FairqError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(FairqError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(FairqError):
    status = 403
    type = "invalid_request_error"
    code = "permission_denied"


class NotFound(FairqError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class UnknownModel(NotFound):
    code = "model_not_found"


class IdempotencyKeyReused(FairqError):
    """An Idempotency-Key sent before with another request (``broker.idempotency``)."""

    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_reused"
    final = True


class IdempotentResultGone(FairqError):
    """An Idempotency-Key whose job ended and expired, or whose file was deleted: a
    second one is not made in its place."""

    status = 410
    type = "invalid_request_error"
    code = "idempotent_result_expired"
    final = True


class BodyTooLarge(FairqError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class QueueFull(FairqError):
    """The user already has the maximum number of queued jobs for this model."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"

    def __init__(self, message: str, *, retry_after_s: int, quota: Reading | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.quota = quota  # the key's quotas as the refusing call found them, if it has any


class OverQuota(FairqError):
    """A limit of the key's tenant's or user's quota would be passed (``broker.quotas``):
    ``quota`` is how the refusing call found them, for the x-ratelimit-* headers and
    Retry-After. One that the request alone passes (``never``) is final: retrying is no
    use, whenever."""

    status = 429
    type = "tokens"  # as OpenAI's: the unit of the limit passed, "tokens" or "requests"
    code = "rate_limit_exceeded"

    def __init__(
        self, message: str, *, unit: str, quota: Reading, retry_after_ms: int, never: bool
    ) -> None:
        super().__init__(message)
        self.type = unit
        self.quota = quota
        self.retry_after_ms = retry_after_ms
        self.final = never


class NotSupported(FairqError):
    """A feature this deployment cannot offer (e.g. the Batch API on a Redis Cluster)."""

    status = 501
    type = "server_error"
    code = "not_supported"


class BrokerUnavailable(FairqError):
    status = 503
    type = "server_error"
    code = "redis_unavailable"


class JobFailed(FairqError):
    """A job ended without a result (failed, cancelled or expired); carries the job's error."""

    status = 502
    type = "server_error"
    code = "job_failed"

    def __init__(
        self, message: str, *, state: str, status: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.state = state
        if status is not None:
            self.status = status
