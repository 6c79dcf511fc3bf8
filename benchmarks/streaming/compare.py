"""Two versions of fairq's streaming hot path side by side: CPU per 1,000 streamed tokens.

A change to the hot path moves the figure by a few percent, and this box moves it by
±15% from one minute to the next, and by as much from one stack to another (where
each process lands on the two cores). So each version gets ``--stacks`` stacks of its
own, all started at once, and the stacks take turns, ``--rounds`` times, in an order
that alternates: every version sees the same noise, and a stack that runs slow counts
once per version. The figures are medians over all rounds of a version.

A version is a source tree (a checkout of this repository, e.g. ``git worktree add
/tmp/base HEAD~3``): its stack's processes import ``broker``, ``dispatcher`` and
``workers`` from it through ``PYTHONPATH``. The processes start in an empty directory:
``python -m`` puts the working directory first on ``sys.path``, ahead of
``PYTHONPATH``, so started from a checkout every stack would run that checkout.
``--env-a``/``--env-b`` set variables for one side only (the same tree twice, with
another setting). The engine is fairq's simulator: its timings are estimates.

Run ``python -m benchmarks.streaming.compare --a /tmp/base --b . --concurrency 50``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from benchmarks.lib.stats import cpu_seconds, machine, markdown_table, median, save
from benchmarks.streaming.client import run_load
from benchmarks.streaming.hot_path import KEY, _body, _stack
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS

_PROCESSES = ("worker", "gateway", "redis", "sim")


@dataclass
class _Arm:
    version: str  # "A" or "B"
    index: int
    url: str
    pids: dict[str, int]
    rounds: list[dict[str, float]] = field(default_factory=list)


def _start(version: str, index: int, *, tree: Path, env: dict[str, str], streams: int,
           work: Path, stacks: ExitStack) -> _Arm:  # fmt: skip
    stack = _stack([free_port(), free_port()], streams, str(work))
    stack.env.update({"PYTHONPATH": str(tree.resolve()), **env})
    stacks.enter_context(stack)
    p = {name: proc.pid for name, proc in stack.processes.items()}
    redis_pid = stack._redis.process.pid if stack._redis and stack._redis.process else 0
    pids = {"worker": p["worker-0"], "gateway": p["api"], "redis": redis_pid,
            "sim": p[f"sim-{DEMO_MODELS[0]}"]}  # fmt: skip
    arm = _Arm(version, index, f"{stack.gateway_url}/v1/chat/completions", pids)
    asyncio.run(run_load(arm.url, _body(8), KEY, 4, seconds=1.0))  # warm-up
    return arm


def _measure(arm: _Arm, streams: int, seconds: float, tokens: int) -> dict[str, float]:
    before = cpu_seconds(arm.pids)
    load = asyncio.run(run_load(arm.url, _body(tokens), KEY, streams, seconds=seconds))
    per_1k = {n: (s - before[n]) * 1e6 / max(load.tokens, 1)
              for n, s in cpu_seconds(arm.pids).items()}  # fmt: skip
    hop = per_1k["worker"] + per_1k["gateway"]
    return {**per_1k, "hop": hop, "hop_per_sim": hop / per_1k["sim"], "failed": load.failed}


def run(trees: dict[str, Path], envs: dict[str, dict[str, str]], *, streams: int,
        seconds: float, tokens: int, rounds: int, stacks: int) -> list[_Arm]:  # fmt: skip
    home = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as started:
        os.chdir(tmp)  # see the module docstring: not a checkout
        started.callback(os.chdir, home)
        arms = []
        for index in range(stacks):
            order = ("A", "B") if index % 2 == 0 else ("B", "A")
            for version in order:
                work = Path(tmp, f"{version}{index}")
                work.mkdir()
                arms.append(_start(version, index, tree=trees[version], env=envs[version],
                                   streams=streams, work=work, stacks=started))  # fmt: skip
        for round_ in range(rounds):
            for arm in arms if round_ % 2 == 0 else arms[::-1]:
                arm.rounds.append(_measure(arm, streams, seconds, tokens))
                r = arm.rounds[-1]
                click.echo(f"round {round_} {arm.version}{arm.index}: hop {r['hop']:.1f} "
                           f"(worker {r['worker']:.1f}, gateway {r['gateway']:.1f}) ms per "
                           "1,000 tokens", err=True)  # fmt: skip
        return arms


def summary(arms: list[_Arm]) -> dict[str, dict[str, float]]:
    out = {}
    for version in ("A", "B"):
        rounds = [r for arm in arms if arm.version == version for r in arm.rounds]
        out[version] = {k: median([r[k] for r in rounds])
                        for k in ("hop", *_PROCESSES, "hop_per_sim")}  # fmt: skip
        out[version]["failed"] = sum(r["failed"] for r in rounds)
    return out


def render(result: dict[str, Any]) -> str:
    s, header = result["summary"], ["version", "tree", "hop", *_PROCESSES, "hop ÷ simulator"]
    rows = [[v, result["trees"][v], *(round(s[v][k], 1) for k in ("hop", *_PROCESSES)),
             round(s[v]["hop_per_sim"], 2)] for v in ("A", "B")]  # fmt: skip
    change = s["B"]["hop"] / s["A"]["hop"] - 1
    return (
        f"{markdown_table(header, rows)}\n\nCPU in ms per 1,000 tokens received, medians of "
        f"{result['rounds']} rounds x {result['stacks']} stacks per version, "
        f"{result['streams']} streams, {result['tokens']} tokens per request, "
        f"{result['seconds']:g} s per round; hop = worker + gateway; B vs A: {change:+.1%}. "
        f"{result['machine']['cores']} cores; engine = fairq's simulator (estimates)."
    )


@click.command()
@click.option("--a", "tree_a", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--b", "tree_b", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--env-a", multiple=True, help="NAME=VALUE for version A's processes only")
@click.option("--env-b", multiple=True, help="NAME=VALUE for version B's processes only")
@click.option("--concurrency", default=50, show_default=True, help="concurrent streams")
@click.option("--seconds", default=6.0, show_default=True, help="length of one round")
@click.option("--tokens", default=100, show_default=True, help="output tokens per request")
@click.option("--rounds", default=4, show_default=True)
@click.option("--stacks", default=2, show_default=True, help="stacks per version")
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(  # noqa: PLR0917 - click passes every option
    tree_a: str, tree_b: str, env_a: tuple[str, ...], env_b: tuple[str, ...], concurrency: int,
    seconds: float, tokens: int, rounds: int, stacks: int, out: str,
) -> None:  # fmt: skip
    trees = {"A": Path(tree_a), "B": Path(tree_b)}
    envs = {"A": dict(e.split("=", 1) for e in env_a), "B": dict(e.split("=", 1) for e in env_b)}
    arms = run(trees, envs, streams=concurrency, seconds=seconds, tokens=tokens, rounds=rounds,
               stacks=stacks)  # fmt: skip
    result = {"benchmark": "compare", "machine": machine(), "streams": concurrency,
              "seconds": seconds, "tokens": tokens, "rounds": rounds, "stacks": stacks,
              "trees": {v: str(t.resolve()) for v, t in trees.items()},
              "env": envs, "summary": summary(arms),
              "rounds_each": [{"version": a.version, "stack": a.index, "rounds": a.rounds}
                              for a in arms],
              "note": "engine = fairq's simulator; its timings are estimates"}  # fmt: skip
    text = render(result)
    save(out, "compare", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
