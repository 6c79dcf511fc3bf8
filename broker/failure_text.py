"""What the client of a failed job is told of its failure (pure, no I/O).

A 4xx is the request's fault, and the engine's reason says what to fix: it is passed on,
with any address in it replaced (``scrub_addresses``: a proxy in front of an engine
names its upstream in its error page, vLLM names a URL it could not fetch). Any other
failure's message is the server's own detail -- the worker writes the engine's URL and
the socket's error into it (``workers.engine``), and an engine's 5xx body may name its
hosts -- so the client is told the kind of failure and the job id, and the worker's log
holds the detail under that id (``workers.service``). The gateway
(``gateway.outcomes``) and the Batch API's output files (``broker.batch.lines``) say
the same.
"""

from __future__ import annotations

import re

# The status of a failure whose record names none (or no error status): the engine or
# the worker failed it, as a gateway in front of them says.
FAILED_STATUS = 502

# What a client is told of a 5xx failure, by status, else by code, else ``_SERVER_FAILED``.
_FAILURES_BY_CODE = {
    "engine_unreachable": "the model's engine could not be reached; retry it later",
    "engine_stream_cut": "the connection to the model's engine broke before the "
    "response was complete",
}
_SERVER_FAILURES = {
    503: "the request could not be served now; retry it later",
    504: "the engine did not answer in time",
}
_SERVER_FAILED = "the request failed in its engine or worker"

# What stands for an address taken out of a message.
HIDDEN = "<internal address>"
# A URL of any scheme (http://10.0.0.7:8000/v1, redis://:pw@redis:6379/0), an IPv4
# address with or without its port, a bracketed IPv6 one with a port, and a host name
# with a port (``engine-0.fairq.svc:8000``, ``localhost:8000``). A host name alone is
# kept: it cannot be told from a word (``vllm``), and is not an address without a port.
_ADDRESS = re.compile(
    r"""
    \b[a-z][a-z0-9+.-]*://[^\s'"<>]*[^\s'"<>.,;:!?)]
    | \[[0-9a-f:.]+\]:\d{1,5}\b
    | \b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b
    | \b(?:localhost|[a-z0-9-]+(?:\.[a-z0-9-]+)+):\d{1,5}\b
    """,
    re.IGNORECASE | re.VERBOSE,
)


def scrub_addresses(text: str) -> str:
    """``text`` with every URL and network address in it replaced by ``HIDDEN``."""
    return _ADDRESS.sub(HIDDEN, text)


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
        return scrub_addresses(message)
    code = error.get("code")
    what = _SERVER_FAILURES.get(status) or _FAILURES_BY_CODE.get(str(code), _SERVER_FAILED)
    what += f" ({code})" if code else ""
    return f"{what}; the operator's log has the detail under job {job_id}"
