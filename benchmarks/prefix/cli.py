"""`fairq bench prefix`: prefix-aware routing against least-loaded, side by side in one run.

One model served by several simulated replicas (each with vLLM's prefix cache,
``sim._prefix``) behind one fairq stack, all on 127.0.0.1. For each load
(``load``: a multi-turn chat, an agent, and a control whose prompts share
nothing) each arm gets fresh replicas (cold
caches), a fresh fairq with the model's ``routing`` set to the arm's, and the same
conversations. Measured per arm: time to first token (p50, p95), output tokens/s
over the load's wall time, the replicas' prefix-cache hit rate (vLLM's own
``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, summed over replicas),
the prompt tokens the replicas prefilled, and the requests each replica served
(max / mean: 1.0 is an even spread). The figures are the simulator's estimates.

Every process is stopped when the run ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.lib.stats import machine, markdown_table, pct, save
from benchmarks.prefix.load import LoadRun, LoadShape, agent, chat, oneshot, run_load
from broker import hash_key
from fairq.runtime import environment
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack

MODEL = "bench-prefix"
APP_KEY = "fq-bench-prefix-app"
ARMS = ("least_loaded", "prefix")
START_TIMEOUT_S = 60.0
_QUIET = {"FAIRQ_LOG_LEVEL": "WARNING"}


@dataclass(frozen=True)
class Options:
    replicas: int
    profile: str
    cache_tokens: int | None  # the replicas' prefix cache; None: the profile's
    loads: tuple[LoadShape, ...]
    arms: tuple[str, ...]
    seed: int
    deadline_s: float
    out: str | None


def say(message: str) -> None:
    click.echo(f"prefix: {message}", err=True)


# --- the stack --------------------------------------------------------------------------


@contextlib.contextmanager
def replicas(count: int, profile: Path) -> Iterator[list[str]]:
    """``count`` fresh simulated replicas of MODEL (one stack each: one process each)."""
    with contextlib.ExitStack() as on_exit:
        urls = []
        for _ in range(count):
            port = free_port()
            stack = Stack({}, gateway_port=0, sims={port: MODEL}, sim_profiles={port: str(profile)},
                          workers=0, dispatchers=0, gateway=False)  # fmt: skip
            stack.start(START_TIMEOUT_S)  # stops what it started if it fails
            on_exit.callback(stack.stop)
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


def fairq_config(routing: str, endpoints: Sequence[str], batch_slots: int) -> dict[str, Any]:
    """One model on every replica, routed as the arm says, and one trusted app key that
    names each conversation's user (``user``)."""
    model = {"name": MODEL, "engine": "vllm", "endpoints": list(endpoints),
             "batch_slots": batch_slots, "routing": routing}  # fmt: skip
    key = {"sha256": hash_key(APP_KEY), "user": "app", "trusted_app": True}
    return {"models": [model], "api_keys": [key], "max_queued_per_user": 1000}


@contextlib.contextmanager
def fairq(routing: str, endpoints: Sequence[str], batch_slots: int) -> Iterator[Stack]:
    stack = Stack(fairq_config(routing, endpoints, batch_slots), gateway_port=free_port(),
                  workers=2, batch_workers=0, env=_QUIET)  # fmt: skip
    stack.start(START_TIMEOUT_S)  # stops what it started if it fails
    try:
        yield stack
    finally:
        stack.stop()


def write_profile(base: str, cache_tokens: int | None, folder: Path) -> tuple[Path, int]:
    """The base profile (with ``cache_tokens`` of prefix cache, if given) as a file the
    replicas read, and its batch (max_num_seqs)."""
    from sim import load_profile

    profile = load_profile(base)
    if cache_tokens is not None:
        profile = profile.model_copy(update={"prefix_cache_tokens": cache_tokens})
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(profile.model_dump()))
    return path, profile.max_num_seqs


# --- one arm ----------------------------------------------------------------------------


def replica_counters(url: str) -> dict[str, float]:
    """The replica's prefix-cache counters and requests served, from its /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    wanted = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:request_success_total": "requests",
    }
    out = dict.fromkeys(wanted.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and sample.labels.get("model_name") == MODEL:
                out[wanted[sample.name]] += sample.value
    return out


def run_arm(options: Options, shape: LoadShape, routing: str, folder: Path) -> dict[str, Any]:
    profile, batch = write_profile(options.profile, options.cache_tokens, folder)
    with replicas(options.replicas, profile) as urls, fairq(routing, urls, batch) as stack:
        url = f"{stack.gateway_url}/v1/chat/completions"
        load = asyncio.run(run_load(url, APP_KEY, MODEL, shape, seed=options.seed,
                                    deadline_s=options.deadline_s))  # fmt: skip
        dead = stack.dead()
        counters = [replica_counters(u) for u in urls]
    return summarize(load, counters, dead)


def summarize(load: LoadRun, counters: list[dict[str, float]], dead: str | None) -> dict[str, Any]:
    ok = [t for t in load.turns if t.error is None and t.ttft_s is not None]
    ttfts = [t.ttft_s * 1000 for t in ok if t.ttft_s is not None]
    queries = sum(c["queries"] for c in counters)
    hits = sum(c["hits"] for c in counters)
    served = [c["requests"] for c in counters]
    mean = sum(served) / len(served) if served else 0.0
    errors = sorted({t.error for t in load.turns if t.error is not None})
    return {
        "requests": len(load.turns),
        "succeeded": len(ok),
        "errors": errors[:5] + ([f"process exited: {dead}"] if dead else []),
        "ttft_p50_ms": round(pct(ttfts, 50), 1),
        "ttft_p95_ms": round(pct(ttfts, 95), 1),
        "tokens_per_s": round(sum(t.tokens for t in ok) / load.wall_s, 1) if load.wall_s else 0.0,
        "wall_s": round(load.wall_s, 2),
        "prefix_hit_rate": round(hits / queries, 3) if queries else 0.0,
        "prefilled_tokens": int(queries - hits),
        "served_per_replica": [int(s) for s in served],
        "load_max_over_mean": round(max(served) / mean, 2) if mean else 0.0,
    }


# --- the run ----------------------------------------------------------------------------


def run(options: Options) -> dict[str, Any]:
    loads: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fairq-bench-prefix-") as folder:
        for shape in options.loads:
            loads[shape.name] = {"shape": shape.__dict__, "arms": {}}
            for routing in options.arms:
                say(f"{shape.name}: {routing} ({options.replicas} replicas)")
                loads[shape.name]["arms"][routing] = run_arm(options, shape, routing, Path(folder))
    failed = [
        f"{name}/{arm}"
        for name, section in loads.items()
        for arm, figures in section["arms"].items()
        if figures["succeeded"] < figures["requests"] or figures["errors"]
    ]
    return {
        "benchmark": "prefix",
        "engine": "simulator (estimates)",
        "profile": options.profile,
        "prefix_cache_tokens": options.cache_tokens,
        "replicas": options.replicas,
        "seed": options.seed,
        "machine": machine(),
        "loads": loads,
        "failed_arms": failed,
    }


COLUMNS = ("load", "routing", "ok", "TTFT p50 ms", "TTFT p95 ms", "tokens/s", "hit rate",
           "prefilled tokens", "max/mean load", "wall s")  # fmt: skip


def _row(load: str, arm: str, f: dict[str, Any]) -> tuple[object, ...]:
    return (load, arm, f"{f['succeeded']}/{f['requests']}", f["ttft_p50_ms"],
            f["ttft_p95_ms"], f["tokens_per_s"], f"{f['prefix_hit_rate']:.0%}",
            f["prefilled_tokens"], f["load_max_over_mean"], f["wall_s"])  # fmt: skip


def table(result: dict[str, Any]) -> str:
    rows = [
        _row(name, arm, figures)
        for name, section in result["loads"].items()
        for arm, figures in section["arms"].items()
    ]
    cache = result["prefix_cache_tokens"]
    size = "the profile's prefix cache" if cache is None else f"{cache} tokens of prefix cache"
    head = (
        f"Simulator (estimates), profile {result['profile']} ({size}), {result['replicas']} "
        f"replicas of one model behind one fairq, seed {result['seed']}."
    )
    return head + "\n\n" + markdown_table(COLUMNS, rows)


@click.command(name="prefix", epilog=environment())
@click.option("--replicas", default=4, show_default=True, help="simulated replicas of the model")
@click.option("--profile", default="h100-8b", show_default=True, help="the replicas' sim profile")
@click.option("--prefix-cache-tokens", type=int, default=None, help="per replica [the profile's]")
@click.option(
    "--loads",
    "load_names",
    default="chat,agent,oneshot",
    show_default=True,
    help="chat, agent, oneshot (the control: no prompt shares a prefix)",
)
@click.option("--arms", default=",".join(ARMS), show_default=True, help="routings to compare")
@click.option("--chat-sessions", default=32, show_default=True)
@click.option("--chat-turns", default=5, show_default=True)
@click.option("--agent-sessions", default=12, show_default=True)
@click.option("--agent-turns", default=10, show_default=True)
@click.option("--seed", default=1, show_default=True, help="of the conversations' text")
@click.option("--deadline-s", default=180.0, show_default=True, help="per load and arm")
@click.option("--out", default="bench-out/prefix", show_default=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def main(
    *,
    replicas: int,
    profile: str,
    prefix_cache_tokens: int | None,
    load_names: str,
    arms: str,
    chat_sessions: int,
    chat_turns: int,
    agent_sessions: int,
    agent_turns: int,
    seed: int,
    deadline_s: float,
    out: str,
    as_json: bool,
) -> None:
    """Prefix-aware routing against least-loaded on a multi-turn chat and an agent load,
    over simulated replicas of one model: TTFT, tokens/s, prefix-cache hit rate, spread."""
    shapes = {
        "chat": chat(chat_sessions, chat_turns),
        "agent": agent(agent_sessions, agent_turns),
        "oneshot": oneshot(),
    }
    names = [n.strip() for n in load_names.split(",") if n.strip()]
    routings = [a.strip() for a in arms.split(",") if a.strip()]
    unknown = [n for n in names if n not in shapes] + [a for a in routings if a not in ARMS]
    if unknown:
        raise click.BadParameter(f"unknown load or arm: {', '.join(unknown)}")
    options = Options(
        replicas=replicas,
        profile=profile,
        cache_tokens=prefix_cache_tokens,
        loads=tuple(shapes[n] for n in names),
        arms=tuple(routings),
        seed=seed,
        deadline_s=deadline_s,
        out=out,
    )
    try:
        result = run(options)
    except KeyboardInterrupt:
        say("interrupted; every replica and stack was stopped")
        sys.exit(130)
    text = table(result)
    save(out, "prefix", result, text)
    click.echo(json.dumps(result, indent=1) if as_json else text)
    if result["failed_arms"]:
        say(f"FAILED arms: {', '.join(result['failed_arms'])}")
        sys.exit(1)
