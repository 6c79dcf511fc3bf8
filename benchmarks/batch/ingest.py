"""How fast a large batch file is ingested, and what a queued line costs in Redis.

A 50,000-line file is uploaded through the gateway, a batch is created, and the
RQ batch worker ingests it into band-``batch`` jobs. No dispatcher runs, so every
line stays queued: the Redis memory growth from before the upload to
``in_progress``, less the stored input file, is the cost of the queued lines. The
targets: in_progress within 30 s of the create, and at most 2 KB per line
beyond the line's own bytes. ``python -m benchmarks.batch.ingest``.
"""

from __future__ import annotations

import time

import click
import httpx
import redis

from benchmarks.lib.batch_api import batch_file, create, upload, wait_status
from benchmarks.lib.stats import machine, markdown_table, save
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def run(lines: int) -> dict[str, object]:
    data = batch_file(lines, DEMO_MODELS[0], tokens=16)
    config = demo_config([free_port(), free_port()])
    stack = Stack(config, gateway_port=free_port(), workers=0, dispatchers=0)
    with (
        stack,
        httpx.Client(
            base_url=stack.gateway_url,
            timeout=120,
            headers={"Authorization": "Bearer fq-demo-alice"},
        ) as client,
    ):
        assert stack.redis_url is not None
        r = redis.Redis.from_url(stack.redis_url)
        before = used_memory(r)
        start = time.perf_counter()
        file_id = upload(client, data)
        uploaded_s = time.perf_counter() - start
        file_memory = used_memory(r) - before
        start = time.perf_counter()
        batch_id = create(client, file_id)
        batch = wait_status(client, batch_id, ("in_progress", "failed"))
        ingest_s = time.perf_counter() - start
        after = used_memory(r)
    assert batch["status"] == "in_progress", batch
    per_line = (after - before - file_memory) / lines
    line_bytes = len(data) / lines
    return {
        "benchmark": "batch_ingest",
        "machine": machine(),
        "lines": lines,
        "file_bytes": len(data),
        "upload_s": uploaded_s,
        "create_to_in_progress_s": ingest_s,
        "file_memory_bytes": file_memory,
        "memory_per_queued_line_bytes": per_line,
        "line_bytes": line_bytes,
        "overhead_per_line_bytes": per_line - line_bytes,
    }


def render(result: dict[str, object]) -> str:
    rows: list[list[object]] = [
        ["lines", result["lines"]],
        ["file size (MB)", f"{int(result['file_bytes']) / 2**20:.1f}"],  # type: ignore[call-overload]
        ["upload (s)", result["upload_s"]],
        ["create -> in_progress (s), target <= 30", result["create_to_in_progress_s"]],
        ["Redis memory of the stored file (bytes)", result["file_memory_bytes"]],
        ["Redis memory per queued line (bytes)", result["memory_per_queued_line_bytes"]],
        ["the line's own bytes", result["line_bytes"]],
        ["beyond the line's bytes, target <= 2048", result["overhead_per_line_bytes"]],
    ]
    cores = result["machine"]["cores"]  # type: ignore[index]
    return markdown_table(["measure", "value"], rows) + f"\n\n{cores} cores, one batch worker."


@click.command()
@click.option("--lines", default=50_000, show_default=True)
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(lines: int, out: str) -> None:
    """Ingest a large batch file: seconds to in_progress and Redis memory per queued line."""
    result = run(lines)
    text = render(result)
    save(out, "batch_ingest", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
