"""Shared by the batch benchmarks: batch files and following a batch over HTTP."""

from __future__ import annotations

import time

import httpx
import orjson


def batch_file(lines: int, model: str, tokens: int, prompt_chars: int = 200) -> bytes:
    """An OpenAI batch file of chat requests, one per line."""
    prompt = ("Summarise the following text. " * 20)[:prompt_chars]
    out = []
    for i in range(lines):
        body = {
            "model": model,
            "max_tokens": tokens,
            "messages": [{"role": "user", "content": f"{i}: {prompt}"}],
        }
        out.append(
            orjson.dumps(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
            )
        )
    return b"\n".join(out) + b"\n"


def upload(client: httpx.Client, data: bytes) -> str:
    files = {"file": ("bench.jsonl", data, "application/jsonl")}
    response = client.post("/v1/files", data={"purpose": "batch"}, files=files)
    response.raise_for_status()
    return str(response.json()["id"])


def create(client: httpx.Client, file_id: str) -> str:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    response = client.post("/v1/batches", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


def wait_status(
    client: httpx.Client,
    batch_id: str,
    statuses: tuple[str, ...],
    timeout_s: float = 600,
    poll_s: float = 0.05,
) -> dict[str, object]:
    """The batch once its status is one of ``statuses``, read every ``poll_s``;
    TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = client.get(f"/v1/batches/{batch_id}")
        response.raise_for_status()
        batch = response.json()
        if batch["status"] in statuses:
            return dict(batch)
        time.sleep(poll_s)
    raise TimeoutError(f"batch {batch_id} did not reach {statuses} in {timeout_s}s")
