"""An engine's refusal as the job's error: its reason, status and ``param`` passed on."""

from __future__ import annotations

import orjson
import pytest

from sim._wire import error_body
from workers.errors import EngineError

# vLLM's body for a request whose max_tokens do not fit the context, from the releases that
# refuse one: its VLLMValidationError(parameter="max_tokens") becomes the 'param'.
TOO_LARGE = orjson.dumps(
    {
        "error": {
            "message": "'max_tokens' or 'max_completion_tokens' is too large: 9000. This "
            "model's maximum context length is 4096 tokens and your request has 9 input "
            "tokens (9000 > 4096 - 9). (parameter=max_tokens, value=9000)",
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }
    }
)


def test_an_engine_400_keeps_its_reason_status_and_param() -> None:
    error = EngineError.from_response(400, TOO_LARGE).to_error()
    assert error == {
        "message": "the engine rejected the request (400): 'max_tokens' or "
        "'max_completion_tokens' is too large: 9000. This model's maximum context length is "
        "4096 tokens and your request has 9 input tokens (9000 > 4096 - 9). "
        "(parameter=max_tokens, value=9000)",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "engine_http_400",
        "status": 400,
        "engine_status": 400,
    }


@pytest.mark.parametrize(
    "body",
    [
        error_body(400, "BadRequestError", "no field at fault"),  # "param": null
        orjson.dumps({"object": "error", "message": "old shape", "param": ""}),
        orjson.dumps({"error": {"message": "not a name", "param": 3}}),
        b"<html>bad gateway</html>",
    ],
    ids=["null", "empty", "not-a-string", "not-json"],
)
def test_an_engine_error_without_a_field_named_has_param_null(body: bytes) -> None:
    assert EngineError.from_response(400, body).to_error()["param"] is None


def test_a_param_the_engine_names_in_its_older_unwrapped_shape_is_passed_on() -> None:
    body = orjson.dumps({"object": "error", "message": "bad n", "type": "x", "param": "n"})
    assert EngineError.from_response(400, body).param == "n"


def test_the_simulator_names_max_tokens_as_vllm_does() -> None:
    assert orjson.loads(error_body(400, "BadRequestError", "m", "max_tokens"))["error"] == {
        "message": "m",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }
