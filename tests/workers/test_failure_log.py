"""A job failed in the engine or the worker is logged once by its worker, with the detail
its client is not told (``workers.service._log_server_failure``, ``broker.failure_text``)."""

from __future__ import annotations

import logging

import pytest

from broker import JobState
from broker.execution import Outcome
from broker.failure_text import client_message
from workers.service import _log_server_failure

DETAIL = "engine http://10.0.0.7:8000 closed the stream: Server disconnected"


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        ({"message": DETAIL, "code": "engine_stream_cut", "status": 502}, True),
        ({"message": DETAIL, "code": "worker_lost"}, True),  # no status: a server failure
        ({"message": "max_tokens is too large", "code": "engine_rejected", "status": 400}, False),
    ],
)
def test_a_server_failure_is_logged_under_its_job_id_and_a_refusal_is_not(
    caplog: pytest.LogCaptureFixture, error: dict[str, object], logged: bool
) -> None:
    with caplog.at_level(logging.WARNING, logger="workers.service"):
        _log_server_failure("job-1", Outcome(JobState.FAILED, error=error))
    lines = [r.getMessage() for r in caplog.records]
    assert bool(lines) is logged
    if logged:
        assert "job-1" in lines[0] and DETAIL in lines[0]


def test_a_completed_job_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="workers.service"):
        _log_server_failure("job-1", Outcome(JobState.COMPLETED))
    assert not caplog.records


def test_the_client_is_told_the_kind_and_the_job_id_of_a_server_failure_only() -> None:
    cut = {"message": DETAIL, "code": "engine_stream_cut"}
    told = client_message(cut, 502, "job-1")
    assert "10.0.0.7" not in told and "job-1" in told and "engine_stream_cut" in told
    assert "retry it later" in client_message(cut, 503, "job-1")
    assert client_message({"message": "max_tokens is too large"}, 400, "job-1") == (
        "max_tokens is too large"
    )
