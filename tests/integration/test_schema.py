"""Hostile input: requests generated from the gateway's own OpenAPI schema.

A bounded, derandomized (fixed seed) schemathesis run against a real stack
(gateway, dispatcher, worker and a fast simulated engine, as processes, over a
real Redis), with a valid admin key, so that valid requests really run. Both
schema-valid and schema-violating requests are sent (schemathesis' positive and
negative modes). No answer may be a 5xx, every error must be an OpenAI error
object, and every process must still be alive afterwards.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from fairq.stack.localredis import LocalRedis
from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support import local_http
from tests.support.stack import demo_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ADMIN = {"Authorization": "Bearer fq-demo-admin"}
EXAMPLES = int(os.environ.get("FAIRQ_SCHEMA_EXAMPLES", "600"))  # more: a longer hunt
DERANDOMIZE = os.environ.get("FAIRQ_SCHEMA_RANDOM") is None  # fixed seed unless asked
# A small, quick engine: whatever the fuzzer asks for ends within a few hundred steps.
FAST_ENGINE = {"max_num_seqs": 64, "max_model_len": 512, "step_base_ms": 0.3,
               "step_per_seq_ms": 0.01, "prefill_ms_per_token": 0.0,
               "kv_cache_tokens": 65536, "default_output_tokens": 16}  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    profile = tmp_path_factory.mktemp("schema") / "fast.yaml"
    profile.write_text(yaml.safe_dump(FAST_ENGINE))
    overrides = {"max_queued_per_user": 100_000}
    with (
        LocalRedis() as server,
        demo_stack(overrides=overrides, profile=profile, redis_url=server.url) as running,
    ):
        yield running


def test_the_schema_describes_the_request_bodies(stack: Stack) -> None:
    schema = local_http.get(f"{stack.gateway_url}/openapi.json").json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(body["required"]) == {"model", "messages"}
    assert body["properties"]["model"]["enum"] == list(DEMO_MODELS)
    assert any(p["name"] == "X-Fairq-Band" for p in chat["parameters"])
    assert "requestBody" in schema["paths"]["/v1/completions"]["post"]


def _is_openai_error(response: httpx.Response | object) -> bool:
    try:
        error = response.json()["error"]  # type: ignore[attr-defined]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error.get("message"), str) and isinstance(error.get("type"), str)


def test_generated_requests_get_no_server_error(stack: Stack, tmp_path: Path) -> None:
    schema = schemathesis.openapi.from_url(f"{stack.gateway_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    cases = st.one_of([op.as_strategy(generation_mode=mode) for op in operations
                       for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)])  # fmt: skip
    statuses: Counter[int] = Counter()

    @settings(max_examples=EXAMPLES, derandomize=DERANDOMIZE, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=cases)
    def run(case: schemathesis.Case) -> None:
        response = case.call(base_url=stack.gateway_url, headers=ADMIN, timeout=30)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=[not_a_server_error])
        if response.status_code >= 400:
            assert _is_openai_error(response), response.text[:300]

    run()
    print("\nstatus codes of", EXAMPLES, "generated requests:", dict(sorted(statuses.items())))
    assert stack.dead() is None
    assert local_http.get(f"{stack.gateway_url}/readyz").status_code == 200
