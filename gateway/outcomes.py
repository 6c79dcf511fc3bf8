"""How a job that ended without a result is reported to its client.

    failed      the worker's error object ``{"message", "type", "param", "code", "status"}``
                (``param``: the request field the engine named, else null), with its
                ``status`` (502 when it has none or a bad one). A 5xx's message is
                replaced (``shown_message``): it is the server's own detail
    cancelled   409 ``{"type": "cancelled", "code": "job_cancelled"}``: the job was
                cancelled (``DELETE /v1/jobs/{id}``, possibly from another connection)
                while this request waited. 499 is nginx's private code and would
                claim that the client closed the connection, which it did not.
    expired     408 ``{"type": "timeout", "code": "job_expired"}``: it waited in the
                queue past its deadline (its band's, or its own ``X-Fairq-Max-Queue-S``:
                ``broker.deadlines``); with ``x-should-retry: false``, so that the openai
                client does not queue it again by itself (it retries a 408).

    (shutdown)  503 ``{"type": "server_error", "code": "gateway_shutting_down"}``: the
                gateway is stopping and the job had not left the queue (it is
                cancelled); retrying the request is safe.

A streamed request whose job ends so before its first token gets the same status
and body (``gateway.sse`` holds its response headers back until then); one whose
output had begun has sent its 200 already and gets the same error object as one
``data: {"error": {...}}`` event before ``data: [DONE]``.
"""

from __future__ import annotations

from broker.errors import FairqError
from broker.failure_text import FAILED_STATUS, client_message, failed_status
from broker.jobs import JobState
from broker.results import ResultEvent

# Put in a followed job's event queue by the gateway's drain; compared by identity.
SHUTDOWN = ResultEvent(b"gateway-shutdown")


class JobEnded(FairqError):
    """A job that reached a terminal state other than ``completed``."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        type_: str,
        code: str | None,
        param: str | None = None,
        final: bool = False,
    ) -> None:
        super().__init__(message, param=param)
        self.status = status
        self.type = type_
        self.code = code
        self.final = final


def shown_message(error: dict[str, object], job_id: str) -> str:
    """What the client of a failed job is told (``broker.failure_text``)."""
    return client_message(error, failed_status(error), job_id)


def shown_error(error: dict[str, object] | None, job_id: str) -> dict[str, object] | None:
    """A job's error record as its owner may see it (``shown_message``)."""
    if not error:
        return error
    return {**error, "message": shown_message(error, job_id)}


def _failed(error: dict[str, object] | None, job_id: str) -> JobEnded:
    error = error or {}
    code, param = error.get("code"), error.get("param")
    return JobEnded(
        shown_message(error, job_id),
        status=failed_status(error),
        type_=str(error.get("type") or "server_error"),
        code=str(code) if code is not None else None,
        param=param if isinstance(param, str) and param else None,
    )


def ended_error(event: ResultEvent, job_id: str) -> JobEnded | None:
    """The error to report for job ``job_id``'s end event (or ``SHUTDOWN``); None when the
    job completed."""
    if event is SHUTDOWN:
        return JobEnded(
            "the gateway is shutting down and the request had not started; retry it",
            status=503,
            type_="server_error",
            code="gateway_shutting_down",
        )
    if event.end is JobState.FAILED:
        return _failed(event.error, job_id)
    if event.end is JobState.CANCELLED:
        return JobEnded(
            "the request was cancelled", status=409, type_="cancelled", code="job_cancelled"
        )
    if event.end is JobState.EXPIRED:
        return JobEnded(
            "the request expired: it waited in the queue past its deadline (its band's, or "
            "its X-Fairq-Max-Queue-S) without starting",
            status=408,
            type_="timeout",
            code="job_expired",
            final=True,
        )
    return None


def no_body() -> JobEnded:
    """A job that completed without the response body a non-streamed request needs."""
    return JobEnded(
        "the engine returned no response body",
        status=FAILED_STATUS,
        type_="server_error",
        code="engine_error",
    )
