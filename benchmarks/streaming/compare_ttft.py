"""Two versions of fairq side by side: time to first token through three clients.

``benchmarks.streaming.compare`` weighs CPU per token; a change to when a response's bytes go out
(the streamed response's headers, held for its first event) shows in time to first
token instead, and partly in the client: the work a client does on a response's head
lands in TTFT when the head comes with the first token. So each round sends one streamed
request (16 tokens, one at a time) to each arm, in an order that rotates, through each of
three clients: a raw socket (the time to the first content token's bytes: the servers'
side alone), httpx as ``benchmarks.streaming.latency`` reads a stream, and the official ``openai``
client (its first content delta). The arms: the simulator directly, and one stack per
version (``--a``, ``--b``: source trees, as for ``benchmarks.streaming.compare``, whose processes
import from the tree through ``PYTHONPATH``, started from an empty directory). Figures
are medians and 99th percentiles over all rounds.

Run ``python -m benchmarks.streaming.compare_ttft --a /tmp/base --b /path/to/checkout`` from a
directory that is not a checkout. The engine is fairq's simulator: its timings are
estimates.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import click
import httpx
import openai
import orjson
from openai.types.chat import ChatCompletionUserMessageParam

from benchmarks.lib.stats import machine, markdown_table, median, pct, save
from benchmarks.streaming.latency import KEY, Arm, one_request
from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_MODELS, Stack, demo_config

TOKENS = 16
_PROMPT = [ChatCompletionUserMessageParam(role="user", content="Say something.")]
_BODY = orjson.dumps(
    {"model": DEMO_MODELS[0], "stream": True, "max_tokens": TOKENS, "messages": _PROMPT}
)
_CLIENTS = ("raw", "httpx", "openai")


def _stack(tree: Path) -> tuple[Stack, str]:
    ports = [free_port(), free_port()]
    sims = dict(zip(ports, DEMO_MODELS, strict=True))
    stack = Stack(demo_config(ports), gateway_port=free_port(), sims=sims)
    stack.env["PYTHONPATH"] = str(tree.resolve())
    return stack, f"http://127.0.0.1:{ports[0]}"


def raw_ttft_ms(base_url: str, headers: dict[str, str]) -> float:
    """One request on a fresh connection: ms to the first content token's bytes."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
        f"application/json\r\nContent-Length: {len(_BODY)}\r\n{head}\r\n"
    ).encode() + _BODY
    with socket.create_connection((host, int(port))) as sock:
        start = time.perf_counter()
        sock.sendall(request)
        seen, first = b"", None
        while not seen.endswith(b"0\r\n\r\n"):
            piece = sock.recv(65536)
            if not piece:
                break
            seen += piece
            if first is None and b'"content":"' in seen.replace(b'"content":""', b""):
                first = (time.perf_counter() - start) * 1000
    if first is None:
        raise RuntimeError(f"no token from {base_url}: {seen[:300]!r}")
    return first


def openai_ttft_ms(client: openai.OpenAI) -> float:
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=DEMO_MODELS[0], messages=_PROMPT, max_tokens=TOKENS, stream=True
    )
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = (time.perf_counter() - start) * 1000
    if first is None:
        raise RuntimeError("the stream had no token")
    return first


def _probes(url: str, headers: dict[str, str], http: httpx.Client,
            ai: openai.OpenAI) -> dict[str, Callable[[], float]]:  # fmt: skip
    def via_httpx() -> float:
        arm = Arm("", f"{url}/v1/chat/completions", headers)
        one_request(http, arm, TOKENS)
        return arm.ttft_ms[0]

    return {"raw": lambda: raw_ttft_ms(url, headers), "httpx": via_httpx,
            "openai": lambda: openai_ttft_ms(ai)}  # fmt: skip


def run(trees: dict[str, Path], requests: int) -> dict[str, object]:
    home = os.getcwd()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ExitStack() as started,
        httpx.Client(timeout=30) as http,
    ):
        os.chdir(tmp)  # see the module docstring: not a checkout
        started.callback(os.chdir, home)
        probes: dict[str, dict[str, Callable[[], float]]] = {}
        for version, tree in trees.items():
            stack, sim_url = _stack(tree)
            started.enter_context(stack)
            if not probes:
                ai = started.enter_context(openai.OpenAI(base_url=f"{sim_url}/v1", api_key="x"))
                probes["direct"] = _probes(sim_url, {}, http, ai)
            auth = {"Authorization": f"Bearer {KEY}"}
            ai = started.enter_context(
                openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=KEY, max_retries=0)
            )
            probes[version] = _probes(stack.gateway_url, auth, http, ai)
        names = list(probes)
        for name in names:  # warm-up: connections, caches, lazy imports
            for _ in range(10):
                for probe in probes[name].values():
                    probe()
        got: dict[str, dict[str, list[float]]] = {n: {c: [] for c in _CLIENTS} for n in names}
        for i in range(requests):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]
                for client in _CLIENTS:
                    got[name][client].append(probes[name][client]())
    figures = {
        name: {f"{c}_{q}": f(got[name][c]) for c in _CLIENTS
               for q, f in (("p50", median), ("p99", lambda v: pct(v, 99)))}
        for name in names
    }  # fmt: skip
    return {
        "benchmark": "compare_ttft",
        "machine": machine(),
        "requests_per_arm": requests,
        "tokens_per_request": TOKENS,
        "trees": {v: str(t) for v, t in trees.items()},
        "ttft_ms": figures,
        "load1": os.getloadavg()[0],
        "note": "engine = fairq's simulator; its timings are estimates, not a GPU's",
    }


def render(result: dict[str, object]) -> str:
    figures, m, trees = result["ttft_ms"], result["machine"], result["trees"]
    assert isinstance(figures, dict) and isinstance(m, dict) and isinstance(trees, dict)
    header = ["arm", *(f"{c} {q} ms" for c in _CLIENTS for q in ("p50", "p99"))]
    rows = [[name, *(values[f"{c}_{q}"] for c in _CLIENTS for q in ("p50", "p99"))]
            for name, values in figures.items()]  # fmt: skip
    change = {c: figures["B"][f"{c}_p50"] - figures["A"][f"{c}_p50"] for c in _CLIENTS}
    said = ", ".join(f"{c} {d:+.2f} ms" for c, d in change.items())
    return (
        f"{markdown_table(header, rows)}\n\nTime to first token, {result['requests_per_arm']} "
        f"requests per arm and client, {result['tokens_per_request']} tokens each, one at a "
        f"time, arms in turns; A = {trees['A']}, B = {trees['B']}; "
        f"B - A at p50: {said}. {m['cores']} cores, load {result['load1']:.2f} at the end; "
        f"{result['note']}."
    )


@click.command()
@click.option("--a", "tree_a", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--b", "tree_b", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--requests", default=400, show_default=True, help="per arm and client")
@click.option("--out", default="bench-out", show_default=True, type=click.Path())
def main(tree_a: str, tree_b: str, requests: int, out: str) -> None:
    result = run({"A": Path(tree_a), "B": Path(tree_b)}, requests)
    text = render(result)
    save(os.path.abspath(out), "compare_ttft", result, text)
    click.echo(text)


if __name__ == "__main__":
    main()
