"""An engine pod's preStop hook: return once the engine runs and holds no request.

When Kubernetes stops an engine pod (KEDA removes a replica, a rollout, a node drain),
the pod first leaves its headless Service's DNS records, so fairq's dispatchers stop
admitting to it once they read DNS again; then this hook runs, and only after it returns
does the engine get SIGTERM. The hook waits ``settle_s`` (the time a dispatcher may still
send work: its discovery interval and the DNS cache's TTL), then reads the engine's
``/metrics`` every ``interval_s`` until ``vllm:num_requests_running`` plus
``vllm:num_requests_waiting`` (summed over their series) is 0, at most ``timeout_s``;
the pod's ``terminationGracePeriodSeconds`` bounds the whole. A running stream thus ends
before its engine stops, and no job is cut mid-answer by a scale-down.

It runs inside the engine's container, and the vLLM image has Python but not fairq: so
this module uses the standard library only, and runs as a script too (``fairq k8s
install-drain DIR`` copies it to ``DIR/fairq_drain.py``; an init container does that
into a volume the engine's hook runs it from). In fairq's own image it is ``fairq k8s
drain``. Exit status: 0 when the engine is idle, or not serving at all (nothing to wait
for); 1 when ``timeout_s`` passed with requests still in it (Kubernetes then records a
failed hook and stops the engine anyway).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")
SCRIPT_NAME = "fairq_drain.py"


class MetricsUnreadable(Exception):
    """The engine answered, but not with the gauges the drain waits on."""


def requests_in(text: str) -> float:
    """Requests running and waiting in the engine, from its Prometheus text exposition."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(BUSY):
            continue
        brace = line.find("{")
        name_end = brace if brace != -1 else line.find(" ")
        if line[:name_end] not in BUSY:
            continue  # another metric whose name starts alike
        rest = line[line.rindex("}") + 1 :] if brace != -1 else line[name_end:]
        total += float(rest.split()[0])
        seen = True
    if not seen:
        raise MetricsUnreadable(f"no {' or '.join(BUSY)} in the engine's /metrics")
    return total


def read_requests(url: str, timeout_s: float) -> float | None:
    """The engine's requests now; None when nothing listens at ``url`` (engine gone)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/metrics", timeout=timeout_s) as answer:
            return requests_in(answer.read().decode("utf-8", "replace"))
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return None
        raise


def drain(
    url: str,
    *,
    settle_s: float = 0.0,
    timeout_s: float = 600.0,
    interval_s: float = 1.0,
    say: Callable[[str], None] = print,
) -> int:
    """Wait ``settle_s``, then until the engine at ``url`` is idle (0) or ``timeout_s``
    passed (1). A read that fails otherwise than refused is retried until the bound."""
    time.sleep(settle_s)
    deadline = time.monotonic() + timeout_s
    last = "not read yet"
    while True:
        try:
            busy = read_requests(url, timeout_s=max(0.5, min(5.0, interval_s * 2)))
        except (OSError, ValueError, MetricsUnreadable) as exc:
            busy, last = -1.0, f"unreadable ({exc})"
        if busy is None:
            say(f"fairq drain: nothing listens at {url}: nothing to wait for")
            return 0
        if busy == 0:
            say(f"fairq drain: {url} holds no request")
            return 0
        if busy > 0:
            last = f"{busy:g} requests running or waiting"
        if time.monotonic() >= deadline:
            say(f"fairq drain: gave up after {timeout_s:g} s: {url} still has {last}")
            return 1
        time.sleep(interval_s)


def install(directory: Path) -> Path:
    """Copy this module, a standalone script, to ``directory``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / SCRIPT_NAME
    shutil.copyfile(Path(__file__), target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the engine's base URL")
    parser.add_argument("--settle-s", type=float, default=0.0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    return drain(
        args.url, settle_s=args.settle_s, timeout_s=args.timeout_s, interval_s=args.interval_s
    )


if __name__ == "__main__":
    sys.exit(main())
