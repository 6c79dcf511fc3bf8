"""An interactive user's time to first token while a 2,000-line batch runs.

One stack (simulated engine, dispatcher, worker, RQ batch worker, gateway). Arm
"idle": an interactive user (bob) sends streamed chat requests one at a time on
an idle system. Arm "during batch": alice's 2,000-line batch is in progress on
the same model and bob sends the same requests again. Batch lines run in band
``batch``, admitted only while the engine's queue is empty, so bob's requests
should pass them; the target (issue 4) is bob's TTFT within 2x of idle. The
batch is cancelled after the measurement (its lines need not all run). The
simulator's timings are estimates of an engine, not a GPU's.
``python -m benchmarks.batch_ttft``.
"""

from __future__ import annotations

import time

import click
import httpx
import orjson

from benchmarks._batch_common import batch_file, create, upload, wait_status
from benchmarks.stats import machine, markdown_table, median, pct, save
from fairq.localredis import free_port
from fairq.stack import DEMO_MODELS, Stack, demo_config

MODEL = DEMO_MODELS[0]


def ttft_ms(client: httpx.Client, tokens: int) -> float:
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": tokens,
        "messages": [{"role": "user", "content": "Say something."}],
    }
    start = time.perf_counter()
    ttft: float | None = None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():  # read to the end: the next request starts idle
            if ttft is None and line.startswith("data: {"):
                chunk = orjson.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    ttft = (time.perf_counter() - start) * 1000
    if ttft is None:
        raise RuntimeError("the stream carried no content")
    return ttft


def arm(client: httpx.Client, requests: int, tokens: int) -> list[float]:
    out = []
    for _ in range(requests):
        out.append(ttft_ms(client, tokens))
        time.sleep(0.05)  # a person's pace, not a flood
    return out


def running_lines(client: httpx.Client, batch_id: str) -> int:
    counts = client.get(f"/v1/batches/{batch_id}").json()["request_counts"]
    return int(counts["completed"]) + int(counts["failed"])


def run(lines: int, requests: int, tokens: int, batch_tokens: int) -> dict[str, object]:
    ports = [free_port(), free_port()]
    stack = Stack(
        demo_config(ports),
        gateway_port=free_port(),
        sims=dict(zip(ports, DEMO_MODELS, strict=True)),
    )
    auth = {"Authorization": "Bearer fq-demo-bob"}
    with (
        stack,
        httpx.Client(base_url=stack.gateway_url, timeout=120, headers=auth) as bob,
        httpx.Client(
            base_url=stack.gateway_url,
            timeout=120,
            headers={"Authorization": "Bearer fq-demo-alice"},
        ) as alice,
    ):
        arm(bob, 5, tokens)  # warm-up
        idle = arm(bob, requests, tokens)
        batch_id = create(alice, upload(alice, batch_file(lines, MODEL, batch_tokens)))
        wait_status(alice, batch_id, ("in_progress",))
        while running_lines(alice, batch_id) < 5:  # the engine is busy with batch lines
            time.sleep(0.1)
        done_before = running_lines(alice, batch_id)
        start = time.perf_counter()
        during = arm(bob, requests, tokens)
        elapsed = time.perf_counter() - start
        done_during = running_lines(alice, batch_id) - done_before
        alice.post(f"/v1/batches/{batch_id}/cancel").raise_for_status()
        wait_status(alice, batch_id, ("cancelled",))
    return {
        "benchmark": "batch_ttft",
        "machine": machine(),
        "batch_lines": lines,
        "requests_per_arm": requests,
        "interactive_tokens": tokens,
        "batch_tokens": batch_tokens,
        "idle": {"p50": median(idle), "p95": pct(idle, 95)},
        "during": {"p50": median(during), "p95": pct(during, 95)},
        "batch_lines_per_s_during": done_during / elapsed,
        "note": "engine = fairq's simulator; its timings are estimates, not a GPU's",
    }


def render(result: dict[str, object]) -> str:
    idle, during = result["idle"], result["during"]
    assert isinstance(idle, dict) and isinstance(during, dict)
    rows = [[p, idle[p], during[p], during[p] / idle[p]] for p in ("p50", "p95")]
    table = markdown_table(["TTFT", "idle ms", "during batch ms", "ratio (target <= 2)"], rows)
    cores = result["machine"]["cores"]  # type: ignore[index]
    return (
        f"{table}\n\n{result['requests_per_arm']} interactive requests per arm "
        f"({result['interactive_tokens']} tokens), one at a time, while a "
        f"{result['batch_lines']}-line batch ({result['batch_tokens']} tokens a line) ran at "
        f"{result['batch_lines_per_s_during']:.1f} lines/s; {cores} cores. {result['note']}."
    )


@click.command()
@click.option("--lines", default=2000, show_default=True, help="lines of the batch")
@click.option("--requests", default=60, show_default=True, help="interactive requests per arm")
@click.option("--tokens", default=16, show_default=True, help="tokens per interactive request")
@click.option("--batch-tokens", default=64, show_default=True, help="tokens per batch line")
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(lines: int, requests: int, tokens: int, batch_tokens: int, out: str) -> None:
    """Interactive TTFT, idle and while a batch runs (p50/p95 and their ratio)."""
    result = run(lines, requests, tokens, batch_tokens)
    text = render(result)
    save(out, "batch_ttft", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
