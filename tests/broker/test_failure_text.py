"""What a failed job's client is told (``broker.failure_text``): an engine's refusal with
every address taken out of it, a server failure as its kind and the job id only."""

from __future__ import annotations

import pytest

from broker.failure_text import HIDDEN, client_message, scrub_addresses


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "the engine connection broke at http://10.0.0.7:8000/v1/chat/completions: reset",
            f"the engine connection broke at {HIDDEN}: reset",
        ),
        ("upstream (https://engine-0.fairq.svc:8000).", f"upstream ({HIDDEN})."),
        ("redis://:secret@redis:6379/0 refused", f"{HIDDEN} refused"),
        (
            "Error 111 connecting to 127.0.0.1:6379. Connection refused.",
            f"Error 111 connecting to {HIDDEN}. Connection refused.",
        ),
        ("connect to [fd00::7]:8000 failed", f"connect to {HIDDEN} failed"),
        ("engine-0.fairq.svc:8000 or localhost:8000", f"{HIDDEN} or {HIDDEN}"),
        ("no route to 10.1.2.3", f"no route to {HIDDEN}"),
    ],
)
def test_every_url_and_address_is_taken_out_of_a_message(text: str, shown: str) -> None:
    assert scrub_addresses(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens must be at most 4096, got 100000",
        "invalid messages.[0].content: field required",
        "This model's maximum context length is 4096 tokens; the stop at 12:30 is fine",
        "The model `tiny-chat` does not exist.",
    ],
)
def test_a_message_without_an_address_is_kept_as_it_is(text: str) -> None:
    assert scrub_addresses(text) == text


def test_an_engine_refusal_is_passed_on_without_the_address_it_names() -> None:
    error = {"message": "the engine rejected the request (400): proxy http://10.0.0.7:8000 said no"}
    told = client_message(error, 400, "job-1")
    assert told == f"the engine rejected the request (400): proxy {HIDDEN} said no"


def test_an_unreachable_engine_is_named_as_such_with_the_job_id_and_no_address() -> None:
    error = {
        "message": "the engine at http://127.0.0.1:9/v1/chat/completions could not be reached",
        "code": "engine_unreachable",
    }
    told = client_message(error, 502, "job-1")
    assert told.startswith("the model's engine could not be reached")
    assert "job-1" in told and "127.0.0.1" not in told and "http" not in told
