"""``fairq status``, ``fairq top``, ``fairq jobs`` and ``fairq job``: the operator's view.

``status`` prints a table per model (its endpoints with the engine's queue, its batch
(learned, or ``batch_slots``, with a note where the engine disagrees with that),
KV-cache use and time per output token, and the admission state per band; per band
the backlog and the users with most jobs queued; the newcomers' time to first token)
from the snapshots the dispatchers publish into Redis (``broker.status``); ``--json``
prints what ``/admin/status`` answers. ``top`` is the same, redrawn every second until
Ctrl-C. ``jobs`` lists jobs by scanning the models' job hashes (an operator tool: it
reads at most ``--scan`` keys per model), ``job`` shows one job's record.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
import orjson
from redis.asyncio import Redis
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from broker import FairqError, JobQueue, JobRecord, JobState, Settings, connect, keys, read_status
from broker import job_fields as jf
from fairq.runtime import CONFIG, REDIS, SETTING, environment, stack_settings_or_exit

_ENV = environment(CONFIG, REDIS, SETTING)

T = TypeVar("T")


def _run(settings: Settings, work: Callable[[Redis], Awaitable[T]]) -> T:
    async def main() -> T:
        redis = connect(settings)
        try:
            return await work(redis)
        finally:
            await redis.aclose()

    return asyncio.run(main())


async def _status(redis: Redis, settings: Settings) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    models = await read_status(redis, settings, now_ms)
    return {"object": "fairq.status", "at_ms": now_ms, "models": models}


def _dumps(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


# -- rendering ------------------------------------------------------------------------


def _num(value: object, digits: int | None = None) -> str:
    if value is None:
        return "-"
    if digits is not None and isinstance(value, int | float):
        return f"{value:.{digits}f}"
    return str(value)


def _health(ep: dict[str, Any]) -> Text:
    if ep.get("healthy") is None:
        return Text("unknown", style="yellow")
    if not ep["healthy"]:
        return Text("unhealthy", style="red")
    if ep.get("scraped") is False:
        return Text("not scraped")
    return Text("stale", style="yellow") if ep.get("fresh") is False else Text("ok", style="green")


def _endpoints(model: dict[str, Any]) -> Table:
    bands = [b["band"] for b in model["bands"]]
    table = Table(title="endpoints", title_justify="left", expand=True)
    columns = ("endpoint", "health", "waiting", "running", "batch", "KV", "TPOT ms", "in flight")
    for name in columns:
        table.add_column(name, justify="left" if name in ("endpoint", "health") else "right")
    table.add_column("admission: room per band (limit)")
    notes = []
    for ep in model["endpoints"]:
        kv = ep.get("kv_usage")
        table.add_row(
            ep["url"],
            _health(ep),
            _num(ep.get("waiting")),
            _num(ep.get("running")),
            _num(ep.get("batch_slots")),
            "-" if kv is None else f"{kv * 100:.0f}%",
            _num(ep.get("tpot_ms"), 1),
            _num(ep.get("inflight")),
            _admission(ep.get("admission") or {}, bands),
        )
        if ep.get("batch_slots_disagree"):
            notes.append(
                f"{ep['url']}: batch_slots {ep['batch_slots']}, but {ep['batch_slots_disagree']}"
            )
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


def _admission(admission: dict[str, Any], bands: list[str]) -> str:
    """``interactive=3 default=3 batch=1 (queue_target)``; a limit per band where they differ."""
    shown = [b for b in bands if b in admission]
    limits = {admission[b]["limit"] for b in shown}
    if len(limits) == 1:
        rooms = " ".join(f"{b}={admission[b]['room']}" for b in shown)
        return f"{rooms} ({limits.pop()})"
    return " ".join(f"{b}={admission[b]['room']} ({admission[b]['limit']})" for b in shown) or "-"


def _console() -> Console:
    """A terminal's width, or a wide one when piped (ids and URLs are not cut)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _bands(model: dict[str, Any]) -> Table:
    table = Table(title="queues", title_justify="left", expand=True)
    table.add_column("band")
    table.add_column("queued", justify="right")
    table.add_column("users", justify="right")
    table.add_column("top users (queued)")
    for band in model["bands"]:
        top = ", ".join(f"{u['user']} {u['queued']}" for u in band["top_users"])
        table.add_row(band["band"], str(band["queued"]), str(band["backlogged_users"]), top or "-")
    return table


def _model_view(model: dict[str, Any]) -> RenderableType:
    source = (
        f"dispatcher {model['dispatcher']}"
        if model["source"] == "dispatcher"
        else "no dispatcher status: queues read from Redis, engines unknown"
    )
    rate = model.get("dispatch_rate")
    in_engine = ", ".join(f"{u['user']} {u['jobs']}" for u in model.get("in_engine_users", []))
    head = Text.assemble(
        (model["model"], "bold"),
        f"  {model['policy']}, admission {model['admission']}, {source}",
        f", {rate:.2f} jobs/s dispatched" if rate else "",
        _newcomers(model.get("newcomer_ttft_ms")),
    )
    return Group(
        head, _endpoints(model), _bands(model), Text(f"in the engines: {in_engine or '-'}")
    )


def _newcomers(ttft: dict[str, Any] | None) -> str:
    """``, newcomer TTFT p50 80 ms p95 120 ms (12 jobs, 5 min)``: users new to the engine."""
    if not ttft or not ttft.get("jobs"):
        return ""
    return (
        f", newcomer TTFT p50 {ttft['p50']:.0f} ms p95 {ttft['p95']:.0f} ms "
        f"({ttft['jobs']} jobs, {ttft['window_s'] / 60:g} min)"
    )


def render_status(status: dict[str, Any]) -> RenderableType:
    """The text view of a ``/admin/status`` body: one block per model."""
    when = time.strftime("%H:%M:%S", time.localtime(status["at_ms"] / 1000))
    parts: list[RenderableType] = [Text(f"fairq status at {when}", style="dim")]
    for model in status["models"]:
        parts += [Text(""), _model_view(model)]
    return Group(*parts)


# -- commands -------------------------------------------------------------------------


@click.command(epilog=_ENV)
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON")
def status(as_json: bool) -> None:
    """Show each model's endpoints, admission state, backlog and top users."""
    settings = stack_settings_or_exit("status")
    body = _run(settings, lambda redis: _status(redis, settings))
    if as_json:
        click.echo(_dumps(body))
    else:
        _console().print(render_status(body))


@click.command(epilog=_ENV)
@click.option("--interval", default=1.0, show_default=True, help="seconds between refreshes")
def top(interval: float) -> None:
    """The status, live: redrawn every --interval seconds until Ctrl-C."""
    settings = stack_settings_or_exit("top")

    async def watch(redis: Redis) -> None:
        with Live(Text("loading…"), auto_refresh=False, screen=False) as live:
            while True:
                live.update(render_status(await _status(redis, settings)), refresh=True)
                await asyncio.sleep(interval)

    with contextlib.suppress(KeyboardInterrupt):
        _run(settings, watch)


async def _scan_jobs(redis: Redis, model: str, scan: int) -> list[JobRecord]:
    found: list[str] = []
    async for key in redis.scan_iter(match=keys.job_pattern(model), count=1000):
        found.append(key.decode())
        if len(found) >= scan:
            break
    async with redis.pipeline(transaction=False) as pipe:
        for key in found:
            pipe.hgetall(key)
        hashes = await pipe.execute()
    prefix = keys.job_prefix(model)
    return [
        JobRecord.from_hash(key[len(prefix) :], model, h)
        for key, h in zip(found, hashes, strict=True)
        if h and jf.STATE in h
    ]


def _job_row(job: JobRecord) -> dict[str, Any]:
    return {**job.public(), "user": job.user, "tenant": job.tenant, "endpoint": job.endpoint}


@click.command(epilog=_ENV)
@click.option("--model", "model_names", multiple=True, help="only these models [all]")
@click.option("--state", type=click.Choice([s.value for s in JobState]), default=None)
@click.option("--user", default=None, help="only this user's jobs")
@click.option("--limit", default=50, show_default=True, help="newest jobs shown")
@click.option("--scan", default=10_000, show_default=True, help="job keys read per model")
@click.option("--json", "as_json", is_flag=True)
def jobs(
    *,
    model_names: tuple[str, ...],
    state: str | None,
    user: str | None,
    limit: int,
    scan: int,
    as_json: bool,
) -> None:
    """List jobs, newest first (queued, running and those ended within result_ttl_s)."""
    settings = stack_settings_or_exit("jobs")
    names = model_names or tuple(m.name for m in settings.models)

    async def collect(redis: Redis) -> list[JobRecord]:
        found = [job for name in names for job in await _scan_jobs(redis, name, scan)]
        return [
            j
            for j in found
            if (state is None or j.state.value == state) and (user is None or j.user == user)
        ]

    found = sorted(_run(settings, collect), key=lambda j: j.enqueued_ms or 0, reverse=True)
    rows = [_job_row(j) for j in found[:limit]]
    if as_json:
        click.echo(_dumps(rows))
    else:
        _console().print(_jobs_table(rows, len(found)))


def _jobs_table(rows: list[dict[str, Any]], total: int) -> Table:
    table = Table(title=f"{len(rows)} of {total} jobs", title_justify="left")
    table.add_column("id", no_wrap=True)
    for column in ("model", "status", "band", "user", "created", "endpoint"):
        table.add_column(column)
    for row in rows:
        created = row["created_at_ms"]
        when = time.strftime("%H:%M:%S", time.localtime(created / 1000)) if created else "-"
        table.add_row(
            row["id"],
            row["model"],
            row["status"],
            row["band"],
            row["user"],
            when,
            row["endpoint"] or "-",
        )
    return table


@click.command(epilog=_ENV)
@click.argument("job_id")
def job(job_id: str) -> None:
    """Show one job's record (any user's) as JSON."""
    settings = stack_settings_or_exit("job")

    async def read(redis: Redis) -> dict[str, Any]:
        queue = JobQueue(redis, settings)
        record = await queue.get(job_id, None)
        body = _job_row(record)
        position = await queue.position(record)
        if position is not None:
            body["queue_position"] = position.public()
        return body

    try:
        click.echo(_dumps(_run(settings, read)))
    except FairqError as exc:
        click.echo(f"fairq: {exc}", err=True)
        sys.exit(1)
