"""The Batch API end to end with the official ``openai`` client, unchanged, against real
processes (gateway, dispatcher, worker, RQ batch worker, simulator) and a real Redis."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from fairq.stack.localredis import LocalRedis
from fairq.stack.processes import DEMO_MODELS, Stack
from tests.support import local_http
from tests.support.cli import fairq
from tests.support.eventually import eventually
from tests.support.settings import api_key, make_settings
from tests.support.stack import demo_stack, gateway

pytestmark = pytest.mark.integration

MODEL = DEMO_MODELS[0]
_DEADLINE_S = 90


@pytest.fixture(scope="module")
def stack(redis_server: LocalRedis) -> Iterator[Stack]:
    with demo_stack(redis_url=redis_server.url) as running:
        yield running


def client_of(stack: Stack, key: str = "fq-demo-alice") -> OpenAI:
    return OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=key, max_retries=0)


def chat_line(custom_id: str, model: str = MODEL, tokens: int = 4) -> bytes:
    body = {
        "model": model,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": f"hello {custom_id}"}],
    }
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(line)


def wait_for(client: OpenAI, batch_id: str, statuses: tuple[str, ...]) -> openai.types.Batch:
    return eventually(
        lambda: client.batches.retrieve(batch_id),
        f"batch {batch_id} to be {' or '.join(statuses)}",
        _DEADLINE_S,
        until=lambda batch: batch.status in statuses,
        interval_s=0.2,
    )


def records(client: OpenAI, file_id: str | None) -> list[dict[str, object]]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]


def test_a_batch_runs_to_completion_through_the_openai_client(stack: Stack) -> None:
    client = client_of(stack)
    ids = [f"req-{i}" for i in range(40)]
    data = b"\n".join(chat_line(i) for i in ids) + b"\n"
    uploaded = client.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.bytes == len(data) and uploaded.purpose == "batch"
    assert client.files.retrieve(uploaded.id).filename == "input.jsonl"
    assert client.files.content(uploaded.id).content == data
    assert uploaded.id in [f.id for f in client.files.list()]

    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "e2e"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "e2e"}
    done = wait_for(client, batch.id, ("completed", "failed"))
    assert done.status == "completed", done.errors
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (40, 40)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.error_file_id is None

    output = records(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in output) == sorted(ids)  # each exactly once
    first = output[0]
    assert first["error"] is None and first["response"]["status_code"] == 200
    assert first["response"]["body"]["choices"][0]["message"]["content"]
    assert {r["response"]["body"]["service_tier"] for r in output} == {"flex"}  # band batch
    assert first["response"]["request_id"]
    assert batch.id in [b.id for b in client.batches.list()]


def test_the_batch_worker_counts_ended_lines_and_batches_on_its_metrics(stack: Stack) -> None:
    client = client_of(stack)
    data = b"\n".join(chat_line(f"m-{i}") for i in range(5)) + b"\n"
    uploaded = client.files.create(file=("m.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")  # fmt: skip
    assert wait_for(client, batch.id, ("completed", "failed")).status == "completed"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(
            local_http.get(stack.metrics_url("batch-worker-0"), timeout=5).text
        )
        for s in family.samples
    }
    # This module's batches all ran on this one batch worker: at least this one's 5 lines.
    lines = samples[("fairq_batch_requests_total", (("model", MODEL), ("state", "completed")))]
    assert lines >= 5
    assert samples[("fairq_batches_ended_total", (("status", "completed"),))] >= 1


def test_listing_batches_pages_with_limit_and_after(stack: Stack) -> None:
    client = client_of(stack, "fq-demo-bob")
    uploaded = client.files.create(file=("p.jsonl", io.BytesIO(chat_line("x"))), purpose="batch")
    created = [
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(3)
    ]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == created[::-1][:2] and first.has_more
    rest = client.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data][:1] == created[:1]
    assert [b.id for b in client.batches.list(limit=2).iter_pages().__next__().data] == [
        b.id for b in first.data
    ]
    for batch_id in created:
        wait_for(client, batch_id, ("completed",))


def test_a_cancelled_batch_keeps_every_line_once_in_its_files(stack: Stack) -> None:
    client = client_of(stack)
    ids = [f"slow-{i}" for i in range(60)]
    data = b"\n".join(chat_line(i, tokens=200) for i in ids)
    uploaded = client.files.create(file=("slow.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_for(client, batch.id, ("in_progress",))
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_for(client, batch.id, ("cancelled",))
    output = records(client, done.output_file_id)
    errors = records(client, done.error_file_id)
    assert sorted(r["custom_id"] for r in output + errors) == sorted(ids)
    assert errors, "a 60-line batch of long answers cannot have finished before the cancel"
    assert {r["error"]["code"] for r in errors} == {"batch_cancelled"}
    assert done.request_counts is not None
    assert done.request_counts.completed == len(output)
    assert done.request_counts.failed == len(errors)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_fairq_batch_submit_sends_a_file_with_a_bad_line_which_alone_fails(
    stack: Stack, tmp_path: Path
) -> None:
    # The server records a line that is not JSON as a failed line of the batch: the CLI
    # sends it as it is (and says so), not refusing the whole file for it.
    lines = tmp_path / "requests.jsonl"
    good = b'{"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}\n'
    lines.write_bytes(good + b'{"messages": [\n' + good + b"[1, 2]")
    done = fairq(
        "batch", "submit", str(lines), "--model", MODEL, "--wait",
        env={"FAIRQ_API_URL": stack.gateway_url, "FAIRQ_API_KEY": "fq-demo-alice"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warned = [x for x in done.stderr.splitlines() if x.startswith("fairq batch: line")]
    assert [x.split(" ")[3] for x in warned] == ["2", "4"], done.stderr
    assert "is not valid JSON" in warned[0] and "is not a JSON object" in warned[1]
    client = client_of(stack)
    batch = wait_for(client, done.stdout.splitlines()[0], ("completed",))
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 2)
    errors = records(client, batch.error_file_id)
    assert sorted(e["error"]["line"] for e in errors) == [2, 4]  # type: ignore[index]


def test_a_key_sees_only_its_own_files_and_batches(stack: Stack) -> None:
    alice, bob = client_of(stack), client_of(stack, "fq-demo-bob")
    uploaded = alice.files.create(file=("a.jsonl", io.BytesIO(chat_line("a"))), purpose="batch")
    batch = alice.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for call in (
        lambda: bob.files.retrieve(uploaded.id),
        lambda: bob.files.content(uploaded.id),
        lambda: bob.files.delete(uploaded.id),
        lambda: bob.batches.retrieve(batch.id),
        lambda: bob.batches.cancel(batch.id),
        lambda: bob.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert uploaded.id not in [f.id for f in bob.files.list()]
    assert batch.id not in [b.id for b in bob.batches.list()]
    wait_for(alice, batch.id, ("completed",))
    assert alice.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(uploaded.id)


def test_bad_batch_requests_get_openai_errors(stack: Stack) -> None:
    client = client_of(stack)
    uploaded = client.files.create(file=("b.jsonl", io.BytesIO(chat_line("b"))), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint must be one of"):
        client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/embeddings",  # type: ignore[arg-type]
            completion_window="24h",
        )
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="1h"
        )  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("b.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")


@pytest.mark.parametrize("chunked", [False, True])
def test_an_upload_over_the_size_limit_is_refused_with_413(redis_url: str, chunked: bool) -> None:
    settings = make_settings(
        redis_url, model=MODEL, api_keys=[api_key("k", "u")], batch={"max_file_bytes": 4096}
    )
    data = b"\n".join(chat_line(f"big-{i}") for i in range(200))  # ~30 KB
    with gateway(settings) as url:
        if chunked:  # no Content-Length: the count while reading is the guard
            boundary = b"fq"
            body = (
                b'--fq\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                b'--fq\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n'
                b"\r\n" + data * 4 + b"\r\n--fq--\r\n"
            )
            response = local_http.post(
                f"{url}/v1/files",
                content=iter([body[i : i + 8192] for i in range(0, len(body), 8192)]),
                headers={
                    "Authorization": "Bearer k",
                    "Content-Type": f"multipart/form-data; boundary={boundary.decode()}",
                },
            )
            status, error = response.status_code, response.json()["error"]
        else:
            client = OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0)
            with pytest.raises(openai.APIStatusError) as raised:
                client.files.create(file=("big.jsonl", io.BytesIO(data)), purpose="batch")
            status, error = raised.value.status_code, raised.value.body
    assert status == 413
    assert isinstance(error, dict) and error["code"] == "request_too_large"
    assert "4096 bytes" in str(error["message"])
