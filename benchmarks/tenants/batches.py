"""The batch tenant's lines through fairq's Batch API: one file, one batch, followed to
its end (``submit`` and ``follow`` run in a thread beside the load)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import orjson

from benchmarks.lib.batch_api import create, upload, wait_status
from benchmarks.lib.load import make_prompt
from benchmarks.tenants.plan import Sent

POLL_S = 0.25  # the batch's status read this often: a lighter load than the flood's
_DONE = ("completed", "failed", "expired", "cancelled")


@dataclass
class BatchResult:
    """What became of the batch: lines done and failed, when it ended (s after t=0)."""

    lines: int
    completed: int = 0
    failed: int = 0
    status: str = "not submitted"
    end_s: float | None = None
    error: str | None = None

    def errors(self) -> list[str | None]:
        """One entry per line: None for a line answered, else why not."""
        why = self.error or f"batch {self.status}"
        done = [None] * self.completed
        return [*done, *[f"{why}: line not answered"] * (self.lines - self.completed)]


def batch_file(lines: Sequence[Sent], model: str) -> bytes:
    """One line per request, as OpenAI's Batch API takes them."""
    rng, out = random.Random("batch"), []
    for i, sent in enumerate(lines):
        p = sent.planned
        prompt = make_prompt(f"batch {i}", p.prompt_tokens, rng)
        body = {
            "model": model,
            "max_tokens": p.max_tokens,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": prompt}],
        }
        line = {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }
        out.append(orjson.dumps(line))
    return b"\n".join(out) + b"\n"


def run_batch(
    base_url: str, key: str, data: bytes, *, lines: int, t0: float, deadline_s: float
) -> BatchResult:
    """Upload ``data``, create its batch, and follow it until it ends or ``deadline_s``
    after ``t0`` (perf_counter); an HTTP error is the result's error, never raised."""
    result = BatchResult(lines)
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30.0) as client:
        try:
            batch_id = create(client, upload(client, data))
            left_s = max(0.0, t0 + deadline_s - time.perf_counter())
            batch = wait_status(client, batch_id, _DONE, timeout_s=left_s, poll_s=POLL_S)
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            return result
        except TimeoutError:
            result.error = "deadline reached"
            return result
    result.end_s = time.perf_counter() - t0
    counts = batch.get("request_counts")
    counts = counts if isinstance(counts, dict) else {}
    result.status = str(batch["status"])
    result.completed = int(counts.get("completed", 0))
    result.failed = int(counts.get("failed", 0))
    return result
