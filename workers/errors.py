"""The exception tree of the worker side::

    WorkerError
    └── EngineError      the engine answered with an error, broke off, or timed out

An ``EngineError`` carries what the client will see (the engine's own reason
where it gave one, and the request field it named as ``param``), the HTTP
status to report it with, and whether calling the engine again could help
(``retryable``: overload, unreachable, silent, cut off), and whether the engine
never took the request (``unaccepted``: no connection, the connection lost before
the engine answered, or a 503: a replica that is going away), so that another
endpoint may be asked instead (``workers.runner``).
Whether it is *safe* to call again is the runner's call: only while no output
of the job was written.
"""

from __future__ import annotations

import orjson


class WorkerError(Exception):
    """Root of the worker's errors."""


class EngineError(WorkerError):
    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        code: str = "engine_error",
        retryable: bool = False,
        engine_status: int | None = None,
        param: str | None = None,
        unaccepted: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retryable = retryable
        self.engine_status = engine_status  # the status the engine answered, if it did
        self.param = param  # the request field the engine named, if it named one
        self.unaccepted = unaccepted  # the engine never took the request (see above)

    @classmethod
    def from_response(cls, status: int, body: bytes) -> EngineError:
        """Pass the engine's own reason and ``param`` on (vLLM: ``{"error": {"message",
        "type", "param", "code"}}``; older releases: the same fields, unwrapped)."""
        reason = body[:500].decode(errors="replace").strip() or "no reason given"
        param = None
        try:
            parsed = orjson.loads(body)
            error = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                reason = error["message"]
            if isinstance(error, dict) and isinstance(error.get("param"), str):
                param = error["param"] or None
        except orjson.JSONDecodeError:
            pass
        # A 4xx is the request's fault and keeps its status; anything else is a bad gateway.
        # An overloaded or failing engine (5xx, 429) may well answer the next call.
        return cls(
            f"the engine rejected the request ({status}): {reason}",
            status=status if 400 <= status < 500 else 502,
            code=f"engine_http_{status}",
            retryable=status >= 500 or status == 429,
            engine_status=status,
            param=param,
            # What a server says while it shuts down or is not ready (uvicorn, a proxy in
            # front of a pod that is gone): this replica will not take it, another may.
            unaccepted=status == 503,
        )

    def to_error(self) -> dict[str, object]:
        """The job's error record: ``status`` is what the API answers (an engine's 5xx is
        the gateway's 502); ``engine_status``, what the engine answered, is what a batch
        line records, as OpenAI's batch output records the endpoint's own answer."""
        kind = "invalid_request_error" if 400 <= self.status < 500 else "engine_error"
        error: dict[str, object] = {
            "message": self.message,
            "type": kind,
            "param": self.param,
            "code": self.code,
            "status": self.status,
        }
        if self.engine_status is not None:
            error["engine_status"] = self.engine_status
        return error


def no_engine_took(cause: EngineError, endpoint: str, times: int) -> EngineError:
    """The error of a job that was handed back for another endpoint ``times`` times (the
    most allowed) and whose engine, at ``endpoint``, again did not take it (``cause``)."""
    return EngineError(
        f"no engine took the request: it was sent to another endpoint {times} time(s) after "
        f"its engine would not take it, and the last, {endpoint}, would not either "
        f"({cause.code}: {cause.message}); the model's replicas may be down or going away: "
        "please retry later",
        status=503,
        code="engine_unavailable",
        engine_status=cause.engine_status,
    )
