"""A batch file with valid lines, malformed JSON, unknown models and a repeated custom_id:
the right counts and one error per bad line; and a file that is not JSONL at all fails.
Real processes (gateway, dispatcher, worker, RQ batch worker, simulator), real Redis."""

from __future__ import annotations

import io
from collections.abc import Iterator

import openai
import orjson
import pytest
from openai import OpenAI

from fairq.stack.localredis import LocalRedis
from fairq.stack.processes import DEMO_MODELS
from tests.support.eventually import eventually
from tests.support.settings import SIM_FAULTS
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

MODEL = DEMO_MODELS[1]


@pytest.fixture(scope="module")
def client(redis_server: LocalRedis) -> Iterator[OpenAI]:
    with demo_stack(redis_url=redis_server.url, per_model={MODEL: SIM_FAULTS}) as stack:
        yield OpenAI(base_url=f"{stack.gateway_url}/v1", api_key="fq-demo-alice", max_retries=0)


def line(custom_id: str, model: str = MODEL) -> bytes:
    body = {"model": model, "prompt": f"say {custom_id}", "max_tokens": 3}
    return orjson.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}
    )


def run(client: OpenAI, data: bytes) -> openai.types.Batch:
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    return eventually(
        lambda: client.batches.retrieve(batch.id),
        "the batch to complete or fail",
        60,
        until=lambda batch: batch.status in ("completed", "failed"),
        interval_s=0.2,
    )


def records(client: OpenAI, file_id: str | None) -> list[dict[str, object]]:
    assert file_id is not None
    return [orjson.loads(r) for r in client.files.content(file_id).content.splitlines()]


def test_invalid_lines_go_to_the_error_file_and_the_valid_ones_still_run(client: OpenAI) -> None:
    lines = [
        line("ok-1"),  # 1
        b'{"custom_id": "broken", "method": ',  # 2 malformed JSON
        line("ok-2"),  # 3
        line("ghost-1", model="no-such-model"),  # 4 unknown model
        b"",  # 5 blank: not a request
        line("ok-1"),  # 6 repeated custom_id
        line("ghost-2", model="no-such-model"),  # 7 unknown model
        b"[1, 2, 3]",  # 8 JSON, not a request
        line("ok-3"),  # 9
    ]
    batch = run(client, b"\n".join(lines))
    assert batch.status == "completed"
    assert batch.request_counts is not None
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (8, 3, 5)
    output = records(client, batch.output_file_id)
    assert sorted(r["custom_id"] for r in output) == ["ok-1", "ok-2", "ok-3"]
    assert all(r["response"]["status_code"] == 200 for r in output)  # type: ignore[index]
    errors = {r["error"]["line"]: r for r in records(client, batch.error_file_id)}  # type: ignore[index]
    assert sorted(errors) == [2, 4, 6, 7, 8]
    codes = {n: r["error"]["code"] for n, r in errors.items()}  # type: ignore[index]
    assert codes == {
        2: "invalid_json",
        4: "model_not_found",
        6: "duplicate_custom_id",
        7: "model_not_found",
        8: "invalid_line",
    }
    assert errors[4]["custom_id"] == "ghost-1" and errors[6]["custom_id"] == "ok-1"
    assert "line 1" in errors[6]["error"]["message"]  # type: ignore[index]
    assert all(r["response"] is None for r in errors.values())


def test_a_line_with_a_field_its_model_does_not_allow_fails_alone(client: OpenAI) -> None:
    templated = orjson.loads(line("templated"))
    templated["body"]["chat_template"] = "{{ 7 * 7 }}"  # vLLM's, refused by default
    batch = run(client, b"\n".join([line("ok"), orjson.dumps(templated)]))
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 1)
    [error] = [r["error"] for r in records(client, batch.error_file_id)]
    assert error["code"] == "field_not_allowed" and error["line"] == 2  # type: ignore[index]
    assert "'chat_template'" in error["message"]  # type: ignore[index]


def test_a_line_the_engine_answered_with_an_error_records_the_engines_status(
    client: OpenAI,
) -> None:
    def failing(custom_id: str, status: int) -> bytes:
        record = orjson.loads(line(custom_id))
        record["body"]["sim_fault"] = {"kind": "status", "status": status, "message": "boom"}
        return orjson.dumps(record)

    batch = run(client, b"\n".join([failing("e500", 500), failing("e400", 400), line("ok")]))
    assert batch.status == "completed"
    errors = {r["custom_id"]: r["response"] for r in records(client, batch.error_file_id)}
    assert {k: v["status_code"] for k, v in errors.items()} == {"e500": 500, "e400": 400}  # type: ignore[index]
    # The engine's reason for a 4xx says what to fix; a 5xx's is the server's own detail,
    # kept in the log under the job id the line names.
    assert "boom" in errors["e400"]["body"]["error"]["message"]  # type: ignore[index]
    shown = errors["e500"]["body"]["error"]["message"]  # type: ignore[index]
    assert "boom" not in shown and "the operator's log" in shown
    assert errors["e500"]["request_id"] in shown  # type: ignore[index]
    body_fields = set(errors["e500"]["body"]["error"])  # type: ignore[index]
    assert body_fields == {"message", "type", "param", "code"}  # OpenAI's error object


def test_a_file_that_is_not_jsonl_fails_the_batch_with_errors(client: OpenAI) -> None:
    batch = run(client, b"id,prompt\n1,hello\n2,world\n")
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == "invalid_file"
    assert {e.code for e in batch.errors.data[1:]} == {"invalid_json"}
    assert batch.output_file_id is None
