"""An interactive user's time to first token while a 2,000-line batch runs.

One stack (simulated engine, dispatcher, worker, RQ batch worker, gateway). Arm
"idle": an interactive user (bob) sends streamed chat requests one at a time on
an idle system. Arm "during batch": alice's 2,000-line batch is in progress on
the same model and bob sends the same requests again, one after another, until
the batch has ended. Batch lines run in band ``batch``, admitted only while the
engine's queue is empty, so bob's requests should pass them; the target (issue
4) is bob's TTFT within 2x of idle. Also reported: how long the batch took from
``in_progress`` to ``completed`` and its lines per second. ``--max-seconds``
bounds the run: a batch still going then is cancelled, and the figures say so.
The simulator's timings are estimates of an engine, not a GPU's.
``python -m benchmarks.batch.ttft``.
"""

from __future__ import annotations

import time

import click
import httpx
import orjson

from benchmarks.lib.batch_api import batch_file, create, upload, wait_status
from benchmarks.lib.stats import machine, markdown_table, median, pct, save
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config

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


def batch_state(client: httpx.Client, batch_id: str) -> tuple[str, int, int]:
    """The batch's status, lines ended, and lines failed."""
    batch = client.get(f"/v1/batches/{batch_id}").json()
    counts = batch["request_counts"]
    ended = int(counts["completed"]) + int(counts["failed"])
    return str(batch["status"]), ended, int(counts["failed"])


def during_batch(
    bob: httpx.Client, alice: httpx.Client, batch_id: str, tokens: int, max_s: float
) -> tuple[list[float], float, str, int, int]:
    """Bob's TTFTs while the batch runs, then the batch's seconds, status and counts."""
    start = time.perf_counter()
    ttfts: list[float] = []
    status, ended, failed = batch_state(alice, batch_id)
    while status == "in_progress" and time.perf_counter() - start < max_s:
        ttfts.append(ttft_ms(bob, tokens))
        time.sleep(0.05)  # a person's pace, not a flood
        if len(ttfts) % 10 == 0:
            status, ended, failed = batch_state(alice, batch_id)
    if status == "in_progress":
        alice.post(f"/v1/batches/{batch_id}/cancel").raise_for_status()
        status = str(wait_status(alice, batch_id, ("cancelled",))["status"])
    else:
        status = str(wait_status(alice, batch_id, ("completed", "failed"))["status"])
    elapsed = time.perf_counter() - start
    _, ended, failed = batch_state(alice, batch_id)
    return ttfts, elapsed, status, ended, failed


def run(
    lines: int, requests: int, tokens: int, batch_tokens: int, max_s: float
) -> dict[str, object]:
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
        during, elapsed, status, ended, failed = during_batch(bob, alice, batch_id, tokens, max_s)
    return {
        "benchmark": "batch_ttft",
        "machine": machine(),
        "batch_lines": lines,
        "requests_per_arm": requests,
        "interactive_tokens": tokens,
        "batch_tokens": batch_tokens,
        "idle": {"p50": median(idle), "p95": pct(idle, 95)},
        "during": {"p50": median(during), "p95": pct(during, 95), "requests": len(during)},
        "batch_status": status,
        "batch_lines_ended": ended,
        "batch_lines_failed": failed,
        "batch_seconds": elapsed,
        "batch_lines_per_s": ended / elapsed,
        "note": "engine = fairq's simulator; its timings are estimates, not a GPU's",
    }


def render(result: dict[str, object]) -> str:
    idle, during = result["idle"], result["during"]
    assert isinstance(idle, dict) and isinstance(during, dict)
    rows = [[p, idle[p], during[p], during[p] / idle[p]] for p in ("p50", "p95")]
    table = markdown_table(["TTFT", "idle ms", "during batch ms", "ratio (target <= 2)"], rows)
    cores = result["machine"]["cores"]  # type: ignore[index]
    return (
        f"{table}\n\n{result['requests_per_arm']} interactive requests idle and "
        f"{during['requests']} during the batch ({result['interactive_tokens']} tokens), one "
        f"at a time. The {result['batch_lines']}-line batch ({result['batch_tokens']} tokens a "
        f"line) ended {result['batch_status']} after {result['batch_seconds']:.1f} s: "
        f"{result['batch_lines_ended']} lines ({result['batch_lines_failed']} failed), "
        f"{result['batch_lines_per_s']:.1f} lines/s; {cores} cores. {result['note']}."
    )


@click.command()
@click.option("--lines", default=2000, show_default=True, help="lines of the batch")
@click.option("--requests", default=60, show_default=True, help="interactive requests idle")
@click.option("--tokens", default=16, show_default=True, help="tokens per interactive request")
@click.option("--batch-tokens", default=64, show_default=True, help="tokens per batch line")
@click.option("--max-seconds", default=600.0, show_default=True, help="then cancel the batch")
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(
    *, lines: int, requests: int, tokens: int, batch_tokens: int, max_seconds: float, out: str
) -> None:
    """Interactive TTFT, idle and while a batch runs (p50/p95 and their ratio)."""
    result = run(lines, requests, tokens, batch_tokens, max_seconds)
    text = render(result)
    save(out, "batch_ttft", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
