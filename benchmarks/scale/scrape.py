"""The dispatcher's cost of reading engines' ``/metrics``, per endpoint, at fleet scale.

One dispatcher's scraper (``dispatcher.scraper.Scraper``: its grid of ticks, one task per
scrape) reads N endpoints at the default interval, on uvloop as ``fairq dispatcher`` runs.
Every endpoint serves a real vLLM 0.32 ``/metrics`` page
(``tests/fixtures/vllm-0.32-cpu/metrics_load.txt``, 634 lines: 32 running, 8 waiting) as
vLLM serves it (uvicorn's chunked framing), from a lean server in a process of its own;
one counter on the page (``vllm:generation_tokens_total``) grows with every answer, so
every scrape reads new figures, as from an engine under load. Arms, in turns:

    httpx+full      the scrape before issue 23: httpx, every line of the page through
                    prometheus-client's parser
    httpx+filtered  httpx, only the lines admission reads parsed (``wanted_lines``)
    lean            fairq's scraper: kept-alive connections of ``dispatcher.metrics_http``
                    (httptools), the wanted lines, their sample kept while they repeat
    lean+redis      lean, plus what ``fairq dispatcher`` reads from Redis before each
                    scrape (``DispatchStore.unseen``, a private Redis): the whole cost

Every arm runs the same scraper loop; the arms differ in the HTTP client, the parse and
the Redis read. Reported per arm and N: the scraper process's CPU per endpoint per second
(ms) and per scrape (µs, failed ones too), the cores it takes, scrapes done against those
the interval asks for, the scrape latency (request sent to sample ready) p50 and p99, and
for lean+redis the Redis server's CPU. The older arms saturate the
scraper's one core at fleet sizes: their table rows say so (scrapes done under 100%, failed
scrapes). A failed scrape of the lean arm fails the run (its figures would be a cheaper
failure, not a cheaper read), and so does a lean arm that does fewer than 90% of its
scrapes.

    python -m benchmarks.scale.scrape                      # N = 1, 50, 200
    python -m benchmarks.scale.scrape --endpoints 1,10 --seconds 5 --rounds 1
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx
import psutil

from benchmarks.lib.stats import machine, markdown_table, median, pct, save
from fairq.stack.answering import wait_answering
from fairq.stack.localredis import LocalRedis, free_port

ARMS = ("httpx+full", "httpx+filtered", "lean", "lean+redis")
FIXTURE = Path(__file__).resolve().parents[2] / "tests/fixtures/vllm-0.32-cpu/metrics_load.txt"
MODEL_NAME = "tiny"  # the fixture's model_name label
COUNTER = b'vllm:generation_tokens_total{engine="0",model_name="tiny"} '  # grows per answer
INTERVAL_S = 0.2  # the default scrape_interval_s
WARMUP_S = 2.0
DONE_AT_LEAST = 0.9  # of the scrapes due: fewer means the scraper cannot keep up
LEAN = ("lean", "lean+redis")  # fairq's scrape: these must keep up without a failure


def serve(port: int) -> None:
    """The engines: ``/e<i>/metrics`` answers the fixture page for any i (blocking)."""
    import uvloop

    page = FIXTURE.read_bytes()
    head, _, rest = page.partition(COUNTER)
    tail = rest[rest.index(b"\n") :]
    answers = iter(range(1_000_000_000))

    def answer() -> bytes:
        body = b"%s%s%d.0%s" % (head, COUNTER, next(answers), tail)
        return (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )

    class Engine(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.pending = b""

        def data_received(self, data: bytes) -> None:
            self.pending += data
            while b"\r\n\r\n" in self.pending:
                _, self.pending = self.pending.split(b"\r\n\r\n", 1)
                self.transport.write(answer())

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Engine, "127.0.0.1", port)
        await server.serve_forever()

    uvloop.run(main())


def _httpx_fetch(endpoints: int) -> Any:
    """The scrape's HTTP side before issue 23: one httpx client for every endpoint."""
    from dispatcher.metrics_http import FetchError, Page

    limits = httpx.Limits(max_connections=endpoints, max_keepalive_connections=endpoints)
    http = httpx.AsyncClient(limits=limits)

    async def fetch(url: str, timeout_s: float) -> Page:
        try:
            async with asyncio.timeout(timeout_s):
                response = await http.get(url, timeout=timeout_s)
        except TimeoutError:
            raise FetchError(f"no answer within {timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}") from exc
        kind = response.headers.get("content-type", "")
        return Page(response.status_code, kind, response.content)

    return fetch, http


def _unseen(redis_url: str) -> Any:
    """The dispatcher's read before each scrape (``Dispatcher._make_scraper``'s)."""
    from pydantic import SecretStr

    from broker import DispatchStore, Settings, Unseen, connect
    from dispatcher.endpoints import METRICS_LAG_S

    settings = Settings(redis_url=SecretStr(redis_url))
    redis = connect(settings)
    store = DispatchStore(redis, settings)

    async def unseen(endpoint: str, start_s: float) -> Unseen:
        lag_ms, start_ms = int(METRICS_LAG_S * 1000), int(start_s * 1000)
        return await store.unseen([MODEL_NAME], endpoint, lag_ms, start_ms)

    return unseen, redis


async def scrape_for(
    arm: str,
    endpoints: int,
    port: int,
    seconds: float,
    redis: tuple[str, int] | None = None,
    *,
    warmup_s: float = WARMUP_S,
) -> dict[str, Any]:
    """Run the scraper over ``endpoints`` endpoints; its CPU and latencies after
    ``warmup_s`` (connections opened, the first pages read). ``redis``: the URL and
    process id of the Redis the lean+redis arm reads."""
    from dispatcher import scraper as scraping
    from dispatcher.engine_metrics import EngineSample

    unseen, client = _unseen(redis[0]) if arm == "lean+redis" and redis else (None, None)
    redis_cpu = psutil.Process(redis[1]).cpu_times if redis else None
    if arm == "httpx+full":
        # Every line to the parser (a name the scraper imported, replaced in its module).
        scraping.wanted_lines = lambda page: page  # type: ignore[attr-defined]
    fetch, http = _httpx_fetch(endpoints) if arm.startswith("httpx") else (None, None)
    urls = [f"http://127.0.0.1:{port}/e{i}" for i in range(endpoints)]
    latencies: list[float] = []
    failures: list[str] = []

    class Timed(scraping.Scraper):
        async def _fetch(self, endpoint: str, state: Any) -> EngineSample:
            started = time.perf_counter()
            sample = await super()._fetch(endpoint, state)
            latencies.append((time.perf_counter() - started) * 1000)
            return sample

        def _record_failure(self, endpoint: str, reason: str) -> None:
            failures.append(reason)
            super()._record_failure(endpoint, reason)

    scraper = Timed(
        urls,
        fetch,
        interval_s=INTERVAL_S,
        model_names=dict.fromkeys(urls, MODEL_NAME),
        unseen=unseen,
    )
    task = asyncio.create_task(scraper.run())
    await asyncio.sleep(warmup_s)
    latencies.clear()
    failures.clear()
    redis_before = sum(redis_cpu()[:2]) if redis_cpu else 0.0
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    redis_s = sum(redis_cpu()[:2]) - redis_before if redis_cpu else 0.0
    done, attempts = len(latencies), len(latencies) + len(failures)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for closable in (http, client):
        if closable is not None:
            await closable.aclose()
    return {
        "arm": arm,
        "endpoints": endpoints,
        "cpu_ms_per_endpoint_s": cpu * 1000 / endpoints / wall,
        "cpu_us_per_scrape": cpu * 1e6 / max(attempts, 1),
        "cores": cpu / wall,
        "redis_cores": redis_s / wall if arm == "lean+redis" else None,
        "scrapes": done,
        "scrapes_due": endpoints * wall / INTERVAL_S,
        "latency_p50_ms": pct(latencies, 50),
        "latency_p99_ms": pct(latencies, 99),
        "failures": len(failures),
        "first_failure": failures[0] if failures else None,
    }


def child(
    arm: str,
    endpoints: int,
    port: int,
    seconds: float,
    redis: tuple[str, int] | None,
    *,
    warmup_s: float = WARMUP_S,
) -> None:
    """One arm's run on uvloop, printed as JSON (the body of ``_child``'s process)."""
    import uvloop

    result = uvloop.run(scrape_for(arm, endpoints, port, seconds, redis, warmup_s=warmup_s))
    print(json.dumps(result))


def _child(
    arm: str, endpoints: int, port: int, seconds: float, redis: tuple[str, int], *, warmup_s: float
) -> dict[str, Any]:
    """One arm in a fresh process (nothing warmed by the other arms)."""
    args = f"{arm!r}, {endpoints}, {port}, {seconds}, {redis!r}, warmup_s={warmup_s}"
    code = f"from benchmarks.scale.scrape import child; child({args})"
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=warmup_s + seconds + 60,
    )
    if done.returncode != 0:
        raise click.ClickException(f"the {arm} arm failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _row(n: int, arm: str, mine: list[dict[str, Any]]) -> list[object]:
    done = sum(r["scrapes"] for r in mine) / sum(r["scrapes_due"] for r in mine)
    per_scrape = median([r["cpu_us_per_scrape"] for r in mine])
    redis = [r["redis_cores"] for r in mine if r.get("redis_cores") is not None]
    return [
        n,
        arm,
        f"{median([r['cpu_ms_per_endpoint_s'] for r in mine]):.2f}",
        f"{per_scrape / 1000 / INTERVAL_S:.2f}",
        f"{per_scrape:.0f}",
        f"{median([r['cores'] for r in mine]):.3f}",
        f"{median(redis):.3f}" if redis else "",
        f"{done:.0%}",
        f"{median([r['latency_p50_ms'] for r in mine]):.1f}",
        f"{median([r['latency_p99_ms'] for r in mine]):.1f}",
        sum(r["failures"] for r in mine),
    ]


def _table(rows: list[dict[str, Any]]) -> str:
    header = [
        "endpoints",
        "arm",
        "CPU ms / endpoint / s",
        "at every tick",
        "CPU µs / scrape",
        "cores",
        "Redis cores",
        "scrapes done",
        "scrape p50 ms",
        "scrape p99 ms",
        "failed",
    ]
    body = [
        _row(n, arm, [r for r in rows if r["endpoints"] == n and r["arm"] == arm])
        for n in sorted({r["endpoints"] for r in rows})
        for arm in ARMS
        if any(r["endpoints"] == n and r["arm"] == arm for r in rows)
    ]
    return markdown_table(header, body)


def _ratios(rows: list[dict[str, Any]]) -> str:
    """How many times less CPU the lean scrape takes than the one before issue 23."""
    lines = []
    for n in sorted({r["endpoints"] for r in rows}):

        def per_scrape(arm: str, n: int = n) -> float:
            mine = [r["cpu_us_per_scrape"] for r in rows if (r["endpoints"], r["arm"]) == (n, arm)]
            return median(mine)

        lines.append(f"N = {n}: {per_scrape('httpx+full') / per_scrape('lean'):.0f}x")
    return "CPU per scrape, httpx+full over lean: " + ", ".join(lines) + "."


@click.command()
@click.option("--endpoints", default="1,50,200", show_default=True, help="N, comma-separated")
@click.option("--seconds", default=15.0, show_default=True, help="measured per arm and round")
@click.option("--rounds", default=2, show_default=True)
@click.option(
    "--warmup",
    default=WARMUP_S,
    show_default=True,
    help="seconds each arm scrapes before it is measured",
)
@click.option("--out", default="bench-out", show_default=True)
def main(endpoints: str, seconds: float, rounds: int, warmup: float, out: str) -> None:
    """Scrape cost per endpoint: fairq's lean scrape against httpx with the full and the
    filtered parse."""
    counts = [int(n) for n in endpoints.split(",")]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", f"from benchmarks.scale.scrape import serve; serve({port})"]
    )
    try:
        with LocalRedis() as redis:
            assert redis.process is not None
            _wait_up(port)
            rows = []
            for round_ in range(rounds):
                for i, n in enumerate(counts):
                    shift = (round_ + i) % len(ARMS)
                    for arm in ARMS[shift:] + ARMS[:shift]:
                        redis_at = (redis.url, redis.process.pid)
                        rows.append(_child(arm, n, port, seconds, redis_at, warmup_s=warmup))
    finally:
        server.terminate()
        server.wait(timeout=10)
    text = (
        f"{_table(rows)}\n\n{_ratios(rows)}\n\n{machine()['cores']} cores; engine pages: "
        f"{FIXTURE.name}, one counter growing per answer; {seconds:g} s per arm and round, "
        f"{rounds} rounds (medians; scrapes and failures summed)."
    )
    save(out, "scrape", {"machine": machine(), "rows": rows}, text)
    click.echo(text)
    _check(rows)


def _check(rows: list[dict[str, Any]]) -> None:
    """Fail unless fairq's scrape (the lean arms) read every endpoint on time."""
    rows = [r for r in rows if r["arm"] in LEAN]
    failed = [r for r in rows if r["failures"]]
    if failed:
        total = sum(r["failures"] for r in failed)
        raise click.ClickException(f"{total} scrapes failed (first: {failed[0]['first_failure']})")
    behind = [r for r in rows if r["scrapes"] < DONE_AT_LEAST * r["scrapes_due"]]
    if behind:
        names = sorted({r["endpoints"] for r in behind})
        raise click.ClickException(f"fairq's scrape fell behind (N = {names})")


def _wait_up(port: int) -> None:
    if not wait_answering(f"http://127.0.0.1:{port}/e0/metrics", 15):
        raise click.ClickException("the engines' /metrics server did not start")


if __name__ == "__main__":
    main()
