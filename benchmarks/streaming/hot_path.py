"""CPU per streamed token, and streaming fan-out, side by side with baselines.

CPU arms, one after the other at each concurrency, against
one engine simulator that makes ~50 tokens/s per stream and sends one token per
SSE chunk (as vLLM does):

* ``direct``: the clients read the simulator itself (the engine's own cost);
* ``proxy``: a minimal httpx + FastAPI pass-through proxy (``benchmarks.streaming.proxy``),
  the stand-in for a usual Python LLM proxy;
* ``fairq``: gateway -> Redis -> dispatcher -> worker -> simulator.

Each arm's CPU comes from the processes' own counters (psutil ``cpu_times``,
before and after), divided by the tokens the clients received. The fairq
figure is worker + gateway (its two hops); Redis, the dispatcher and the
simulator are reported beside it. The fan-out arm (item 4) is in
``fanout``. ``--profile`` records py-spy profiles of the worker and the
gateway during the fairq arm at the highest concurrency.

The simulator's timings are estimates of an engine, not a GPU's. Run with
``python -m benchmarks.streaming.hot_path``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
import yaml

from benchmarks.lib.stats import cpu_seconds, machine, markdown_table, median, pct, save
from benchmarks.streaming import fanout as fan_out
from benchmarks.streaming.client import Load, run_load
from benchmarks.streaming.relay_floor import relay_floor_us
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config

KEY = "fq-demo-alice"
STEP_MS = 20.0  # one engine step per token: ~50 tokens/s per stream


def sim_profile(streams: int) -> dict[str, Any]:
    return {"step_base_ms": STEP_MS, "step_per_seq_ms": 0.0, "prefill_ms_per_token": 0.0,
            "max_num_seqs": max(streams, 1), "max_num_batched_tokens": max(streams, 8192),
            "kv_cache_tokens": 1_048_576}  # fmt: skip


def _body(tokens: int) -> dict[str, Any]:
    return {"model": DEMO_MODELS[0], "stream": True, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "Say something."}]}  # fmt: skip


def measure(
    url: str, key: str | None, pids: dict[str, int], *, streams: int, seconds: float, tokens: int
) -> dict[str, Any]:
    """One arm at one concurrency: what the clients got and what each process spent."""
    before = cpu_seconds(pids)
    load: Load = asyncio.run(run_load(url, _body(tokens), key, streams, seconds=seconds))
    spent = {n: s - before[n] for n, s in cpu_seconds(pids).items()}
    per_1k = {n: s * 1e6 / max(load.tokens, 1) for n, s in spent.items()}  # ms per 1,000
    return {
        "streams": streams, "tokens": load.tokens, "requests": load.requests,
        "failed": load.failed, "tokens_per_s": load.tokens / seconds,
        "cpu_ms_per_1k_tokens": per_1k,
        "ttft_p50_ms": median(load.ttft_ms), "itl_p50_ms": median(load.gaps_ms),
        "itl_p99_ms": pct(load.gaps_ms, 99),
    }  # fmt: skip


def _profile(pids: dict[str, int], seconds: float, out: Path) -> list[subprocess.Popen[bytes]]:
    """Start py-spy on each process for ``seconds`` (collapsed stacks, one file each)."""
    spy = Path(sys.executable).with_name("py-spy")
    return [
        subprocess.Popen(
            [
                str(spy),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                "200",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(out / f"profile-{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def _stack(ports: list[int], streams: int, tmp: str) -> Stack:
    config = demo_config(ports)
    config["models"] = config["models"][:1]
    config["models"][0].update(admission="static", inflight_cap=streams * 2)
    profile = Path(tmp, "stream.yaml")
    profile.write_text(yaml.safe_dump(sim_profile(streams)))
    return Stack(config, gateway_port=free_port(), sims={ports[0]: DEMO_MODELS[0]},
                 sim_profiles={ports[0]: str(profile)}, batch_workers=0,
                 env={"FAIRQ_WORKER_CONCURRENCY": str(streams * 2),
                      "FAIRQ_METRICS_PORT": "0"})  # fmt: skip


def run_cpu(concurrency: list[int], seconds: float, tokens: int, rounds: int,
            profile_dir: Path | None) -> list[dict[str, Any]]:  # fmt: skip
    ports, proxy_port = [free_port(), free_port()], free_port()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack_ctx:
        stack = stack_ctx.enter_context(_stack(ports, max(concurrency), tmp))
        sim_url = f"http://127.0.0.1:{ports[0]}"
        proxy = subprocess.Popen([sys.executable, "-m", "benchmarks.streaming.proxy",
                                  "--port", str(proxy_port), "--upstream", sim_url])  # fmt: skip
        stack_ctx.callback(proxy.wait, 10)
        stack_ctx.callback(proxy.terminate)
        stack._wait_http(f"http://127.0.0.1:{proxy_port}/docs", 30)
        p = {n: proc.pid for n, proc in stack.processes.items()}
        redis_pid = stack._redis.process.pid if stack._redis and stack._redis.process else None
        sim = {"sim": p[f"sim-{DEMO_MODELS[0]}"]}
        arms = {
            "direct": (f"{sim_url}/v1/chat/completions", None, sim),
            "proxy": (f"http://127.0.0.1:{proxy_port}/v1/chat/completions", None,
                      {"proxy": proxy.pid, **sim}),
            "fairq": (f"{stack.gateway_url}/v1/chat/completions", KEY,
                      {"worker": p["worker-0"], "gateway": p["api"],
                       "dispatcher": p["dispatcher-0"], "redis": redis_pid or 0, **sim}),
        }  # fmt: skip
        for url, key, _ in arms.values():  # warm-up: connections, scripts, imports
            asyncio.run(run_load(url, _body(8), key, 4, seconds=1.0))
        for streams in concurrency:
            # The arms take turns, ``rounds`` times: each sees the box's noise of the moment,
            # and its row is the median of its rounds.
            measured: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
            for round_ in range(rounds):
                for name, (url, key, pids) in arms.items():
                    spies = []
                    if (profile_dir is not None and name == "fairq" and round_ == 0
                            and streams == max(concurrency)):  # fmt: skip
                        spies = _profile({k: pids[k] for k in ("worker", "gateway")}, seconds,
                                         profile_dir)  # fmt: skip
                    row = measure(url, key, pids, streams=streams, seconds=seconds, tokens=tokens)
                    for spy in spies:
                        spy.wait(timeout=60)
                    measured[name].append({"arm": name, **row})
                    click.echo(_row_line(measured[name][-1]), err=True)
            rows += [_median_row(name, runs) for name, runs in measured.items()]
    return rows


def _median_row(arm: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm at one concurrency over its rounds: medians, and each round's hop CPU."""
    cpu = {n: median([r["cpu_ms_per_1k_tokens"][n] for r in runs])
           for n in runs[0]["cpu_ms_per_1k_tokens"]}  # fmt: skip
    hops = [_hop_ms(r) for r in runs]
    return {
        "arm": arm, "streams": runs[0]["streams"], "rounds": len(runs),
        "tokens": sum(r["tokens"] for r in runs), "requests": sum(r["requests"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "tokens_per_s": median([r["tokens_per_s"] for r in runs]),
        "cpu_ms_per_1k_tokens": cpu, "hop_ms_per_1k_tokens": median(hops),
        "hop_ms_per_round": hops,
        **{k: median([r[k] for r in runs]) for k in ("ttft_p50_ms", "itl_p50_ms", "itl_p99_ms")},
    }  # fmt: skip


def _hop_ms(row: dict[str, Any]) -> float:
    """The hop's CPU per 1,000 tokens: worker + gateway (fairq), the proxy process (proxy)."""
    if "hop_ms_per_1k_tokens" in row:  # a median row: the median of the rounds' hops
        return float(row["hop_ms_per_1k_tokens"])
    cpu = row["cpu_ms_per_1k_tokens"]
    hops = {"fairq": cpu.get("worker", 0) + cpu.get("gateway", 0), "proxy": cpu.get("proxy", 0)}
    return float(hops.get(row["arm"], 0.0))  # "direct": no hop


def _row_line(row: dict[str, Any]) -> str:
    return (f"{row['arm']:>6} x{row['streams']:<4} {row['tokens_per_s']:8.0f} tok/s  "
            f"hop {_hop_ms(row):7.1f} ms/1k  {row['cpu_ms_per_1k_tokens']}")  # fmt: skip


def render_cpu(rows: list[dict[str, Any]], cores: int) -> str:
    header = ["streams", "arm", "tokens/s", "hop CPU ms / 1k tok", "hop, each round",
              "vs proxy", "worker", "gateway", "redis", "dispatcher", "simulator", "ITL p50 ms",
              "ITL p99 ms", "failed"]  # fmt: skip
    proxy = {r["streams"]: _hop_ms(r) for r in rows if r["arm"] == "proxy"}
    table = []
    for r in rows:
        cpu, hop = r["cpu_ms_per_1k_tokens"], _hop_ms(r)
        ratio = f"{hop / proxy[r['streams']]:.2f}x" if r["arm"] != "direct" else "-"
        each = " / ".join(f"{h:.0f}" for h in r.get("hop_ms_per_round", [])) or "-"
        table.append([r["streams"], r["arm"], round(r["tokens_per_s"]), round(hop, 1),
                      each if r["arm"] != "direct" else "-", ratio,
                      *(round(cpu[k], 1) if k in cpu else "-"
                        for k in ("worker", "gateway", "redis", "dispatcher", "sim")),
                      r["itl_p50_ms"], r["itl_p99_ms"], r["failed"]])  # fmt: skip
    return (
        f"{markdown_table(header, table)}\n\nCPU in ms per 1,000 tokens received by the "
        f"clients, from each process's own counters; hop = worker + gateway (fairq) or the "
        f"proxy process; the arms took turns, and each row is the median of its rounds. "
        f"Engine step {STEP_MS:.0f} ms (~{1000 / STEP_MS:.0f} tokens/s per "
        f"stream, one token per SSE chunk); {cores} cores. Engine = fairq's simulator: its "
        "timings are estimates."
    )


@click.command()
@click.option("--concurrency", default="1,50", show_default=True,
              help="concurrent streams per CPU arm, comma-separated")  # fmt: skip
@click.option("--seconds", default=8.0, show_default=True, help="length of each arm")
@click.option("--tokens", default=100, show_default=True, help="output tokens per request")
@click.option("--rounds", default=3, show_default=True,
              help="rounds of the CPU arms, taking turns; each row is their median")  # fmt: skip
@click.option("--fanout", default=200, show_default=True,
              help="streams of the fan-out arm (0: skip it)")  # fmt: skip
@click.option("--profile", "profile", is_flag=True, help="py-spy the worker and gateway")
@click.option("--floor/--no-floor", default=True, show_default=True,
              help="also measure a bare relay's CPU per token at each concurrency")  # fmt: skip
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(  # noqa: PLR0917 - click passes every option
    concurrency: str,
    seconds: float,
    tokens: int,
    rounds: int,
    fanout: int,
    profile: bool,
    floor: bool,
    out: str,
) -> None:
    levels = [int(c) for c in concurrency.split(",") if c]
    Path(out).mkdir(parents=True, exist_ok=True)
    profile_dir = Path(out) if profile else None
    rows = run_cpu(levels, seconds, tokens, rounds, profile_dir) if levels else []
    fan = fan_out.run(fanout, seconds, tokens) if fanout else None
    floors = {n: relay_floor_us(n, period_s=STEP_MS / 1000) for n in levels} if floor else {}
    cores = int(machine()["cores"] or 0)  # type: ignore[call-overload]
    result = {"benchmark": "streaming", "machine": machine(), "seconds": seconds,
              "tokens_per_request": tokens, "cpu": rows, "fanout": fan,
              "relay_floor_us": {str(n): us for n, us in floors.items()},
              "note": "engine = fairq's simulator; its timings are estimates"}  # fmt: skip
    text = render_cpu(rows, cores) if rows else ""
    if floors:
        text += _floor_text(floors)
    if fan is not None:
        text += "\n\n" + fan_out.render(fan, cores)
    save(out, "streaming", result, text)
    click.echo(text)


def _floor_text(floors: dict[int, float]) -> str:
    text = "\n\nThe floor under both hops, a bare uvloop relay of the same streams (one read "
    text += "and one write per token, no HTTP, no Redis; benchmarks/streaming/relay_floor.py): "
    text += ", ".join(f"{us:.0f} µs per token at {n} stream(s)" for n, us in floors.items())
    return text + "."


if __name__ == "__main__":
    main()
