"""What the client of a failed job is told of its failure (pure, no I/O).

A 4xx is the request's fault, and the engine's reason says what to fix: it is passed on.
Any other failure's message is the server's own detail -- the worker writes the
engine's URL and the socket's error into it (``workers.engine``), and an engine's 5xx
body may name its hosts -- so the client is told the kind of failure and the job id,
and the worker's log holds the detail under that id (``workers.service``). The gateway
(``gateway.outcomes``) and the Batch API's output files (``broker.batch.lines``) say
the same.
"""

from __future__ import annotations

# The status of a failure whose record names none (or no error status): the engine or
# the worker failed it, as a gateway in front of them says.
FAILED_STATUS = 502

# What a client is told of a 5xx failure, by status (else ``_SERVER_FAILED``).
_SERVER_FAILURES = {
    503: "the request could not be served now; retry it later",
    504: "the engine did not answer in time",
}
_SERVER_FAILED = "the request failed in its engine or worker"


def failed_status(error: dict[str, object]) -> int:
    """The HTTP status of a failed job's ``error`` record: its own where it is an error
    status, else ``FAILED_STATUS``."""
    status = error.get("status")
    return status if isinstance(status, int) and 400 <= status <= 599 else FAILED_STATUS


def client_message(error: dict[str, object], status: int, job_id: str) -> str:
    """The message of job ``job_id``'s ``error`` record, failed with ``status``, as its
    client may read it (the module docstring)."""
    message = error.get("message")
    message = message if isinstance(message, str) and message else "the request failed"
    if status < 500:
        return message
    code = error.get("code")
    what = _SERVER_FAILURES.get(status, _SERVER_FAILED) + (f" ({code})" if code else "")
    return f"{what}; the operator's log has the detail under job {job_id}"
