"""``fairq status``, ``fairq top``, ``fairq jobs`` and ``fairq job``: the operator's view.

``status`` prints a table per model (its endpoints with the engine's queue, its batch
(learned, or ``batch_slots``, with a note where the engine disagrees with that),
KV-cache use and time per output token, and the admission state per band; per band
the backlog and the users with most jobs queued; the newcomers' time to first token)
from the snapshots the dispatchers publish into Redis (``broker.status``), and the quotas'
use of their limits (``broker.quota_status``); ``--json`` prints what ``/admin/status``
answers. ``top`` is the same, redrawn every second until
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
from redis.exceptions import RedisError
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from broker import FairqError, JobQueue, JobRecord, JobState, Settings, connect, keys, read_status
from broker import job_fields as jf
from broker.quota_status import read_quotas
from fairq.cli.visible import visible
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
    quotas = [q.public() for q in await read_quotas(redis, settings.quotas)]
    return {"object": "fairq.status", "at_ms": now_ms, "models": models, "quotas": quotas}


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


_SLIM: dict[str, Any] = {"box": box.SIMPLE_HEAD, "show_edge": False, "collapse_padding": True}
_ENDPOINT_COLUMNS = ("health", "waiting", "running", "batch", "KV", "TPOT\nms", "in\nflight")


def _url_table(
    title: str, urls: list[str], columns: dict[str, list[str | Text]], width: int
) -> Table:
    """A table of one row per endpoint, its URL first and then ``columns`` (header -> the
    column's cells, right-aligned but the health). The URL column takes what the others
    leave of ``width`` (their widest cell or header line, and the two characters each
    column is apart in ``_SLIM``): all of it for a local stack's URL at 80 columns, and
    a longer URL is folded over lines, every character kept; none is ever cut."""
    beside = sum(
        max(len(str(text)) for text in [*header.splitlines(), *cells]) + 2
        for header, cells in columns.items()
    )
    longest = max((len(u) for u in urls), default=len("endpoint"))
    table = Table(title=title, title_justify="left", expand=True, **_SLIM)
    table.add_column("endpoint", overflow="fold", width=max(16, min(longest, width - beside - 2)))
    for header in columns:
        table.add_column(shown(header), justify="left" if header == "health" else "right")
    for row, url in enumerate(urls):
        table.add_row(shown(url), *(cells[row] for cells in columns.values()))
    return table


def shown(value: object) -> Text:
    """User-supplied text as it is: never rich markup (a user named ``[/]`` crashed the
    parser), and no control sequence (``visible``: rich passes ESC through)."""
    return Text(visible(str(value)))


def _endpoints(model: dict[str, Any], width: int) -> Table:
    rows = [_endpoint_cells(ep) for ep in model["endpoints"]]
    columns = {header: [row[i] for row in rows] for i, header in enumerate(_ENDPOINT_COLUMNS)}
    table = _url_table("endpoints", [ep["url"] for ep in model["endpoints"]], columns, width)
    notes = [
        f"{ep['url']}: batch_slots {ep['batch_slots']}, but {ep['batch_slots_disagree']}"
        for ep in model["endpoints"]
        if ep.get("batch_slots_disagree")
    ]
    if notes:
        table.caption = shown("\n".join(notes))
        table.caption_justify = "left"
    return table


def _endpoint_cells(ep: dict[str, Any]) -> list[str | Text]:
    kv = ep.get("kv_usage")
    return [
        _health(ep),
        _num(ep.get("waiting")),
        _num(ep.get("running")),
        _num(ep.get("batch_slots")),
        "-" if kv is None else f"{kv * 100:.0f}%",
        _num(ep.get("tpot_ms"), 1),
        _num(ep.get("inflight")),
    ]


def _admission(model: dict[str, Any], width: int) -> Table:
    """Per endpoint and band: the room admission gives it now, and its limit."""
    bands = [b["band"] for b in model["bands"]]
    admissions = [ep.get("admission") or {} for ep in model["endpoints"]]
    columns: dict[str, list[str | Text]] = {
        band: [f"{a[band]['room']} ({a[band]['limit']})" if band in a else "-" for a in admissions]
        for band in bands
    }
    urls = [ep["url"] for ep in model["endpoints"]]
    return _url_table("admission: room per band (limit)", urls, columns, width)


def _console() -> Console:
    """A terminal's width, or a wide one when piped (ids and URLs are not cut)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _bands(model: dict[str, Any]) -> Table:
    table = Table(title="queues", title_justify="left", expand=True, **_SLIM)
    table.add_column("band")
    table.add_column("queued", justify="right")
    table.add_column("users", justify="right")
    table.add_column("top users (queued)")
    for band in model["bands"]:
        top = ", ".join(f"{u['user']} {u['queued']}" for u in band["top_users"])
        table.add_row(
            shown(band["band"]),
            str(band["queued"]),
            str(band["backlogged_users"]),
            shown(top or "-"),
        )
    return table


def _model_view(model: dict[str, Any], width: int) -> RenderableType:
    source = (
        f"dispatcher {model['dispatcher']}"
        if model["source"] == "dispatcher"
        else "no dispatcher status: queues read from Redis, engines unknown"
    )
    rate = model.get("dispatch_rate")
    in_engine = ", ".join(f"{u['user']} {u['jobs']}" for u in model.get("in_engine_users", []))
    head = Text.assemble(
        (shown(model["model"]).plain, "bold"),
        f"  {model['policy']}, admission {model['admission']}, {source}",
        f", {rate:.2f} jobs/s dispatched" if rate else "",
        _newcomers(model.get("newcomer_ttft_ms")),
    )
    return Group(
        head,
        _endpoints(model, width),
        _admission(model, width),
        _bands(model),
        shown(f"in the engines: {in_engine or '-'}"),
    )


def _newcomers(ttft: dict[str, Any] | None) -> str:
    """``, newcomer TTFT p50 80 ms p95 120 ms (12 jobs, 5 min)``: users new to the engine."""
    if not ttft or not ttft.get("jobs"):
        return ""
    return (
        f", newcomer TTFT p50 {ttft['p50']:.0f} ms p95 {ttft['p95']:.0f} ms "
        f"({ttft['jobs']} jobs, {ttft['window_s'] / 60:g} min)"
    )


def _quotas(quotas: list[dict[str, Any]]) -> Table:
    """A row per limit of each quota: used of the limit, what is left, when it resets."""
    table = Table(title="quotas", title_justify="left", expand=True, **_SLIM)
    table.add_column("quota", no_wrap=True)
    table.add_column("limit", no_wrap=True)
    for header in ("used", "of", "left", "resets in"):
        table.add_column(header, justify="right", no_wrap=True)
    for quota in quotas:
        who = shown(f"{quota['scope']} {quota['name']}")
        for use in quota["limits"]:
            table.add_row(
                who,
                shown(use["name"]),
                str(use["used"]),
                str(use["limit"]),
                str(use["remaining"]),
                _resets_in(use["reset_s"]),
            )
    return table


def _resets_in(seconds: float) -> str:
    """``41s``, ``6m``, ``3h20m``: as precise as a person needs it."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes = int(seconds // 60)
    return f"{minutes}m" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def render_status(status: dict[str, Any], width: int = 80) -> RenderableType:
    """The text view of a ``/admin/status`` body for a console ``width`` wide: one block
    per model, then the quotas (if any are configured)."""
    when = time.strftime("%H:%M:%S", time.localtime(status["at_ms"] / 1000))
    parts: list[RenderableType] = [Text(f"fairq status at {when}", style="dim")]
    for model in status["models"]:
        parts += [Text(""), _model_view(model, width)]
    if status.get("quotas"):
        parts += [Text(""), _quotas(status["quotas"])]
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
        console = _console()
        console.print(render_status(body, console.width))


@click.command(epilog=_ENV)
@click.option("--interval", default=1.0, show_default=True, help="seconds between refreshes")
def top(interval: float) -> None:
    """The status, live: redrawn every --interval seconds until Ctrl-C."""
    settings = stack_settings_or_exit("top")

    async def watch(redis: Redis) -> None:
        view = _TopView()
        with Live(Text("loading…"), auto_refresh=False, screen=False) as live:
            while True:
                await view.read(redis, settings)
                live.update(view.render(live.console.width, interval), refresh=True)
                await asyncio.sleep(interval)

    with contextlib.suppress(KeyboardInterrupt):
        _run(settings, watch)


class _TopView:
    """What ``fairq top`` shows: the last status read, and, while Redis does not answer,
    since when and why above it (the stack's Redis restarting, or gone: ``top`` goes on
    asking, and shows the stack again once it answers)."""

    def __init__(self) -> None:
        self.status: dict[str, Any] | None = None
        self.lost: tuple[float, str] | None = None  # since (epoch s), the error's line

    async def read(self, redis: Redis, settings: Settings) -> None:
        try:
            self.status, self.lost = await _status(redis, settings), None
        except (RedisError, FairqError, OSError) as exc:
            since = self.lost[0] if self.lost else time.time()
            self.lost = (since, f"{type(exc).__name__}: {exc}")

    def render(self, width: int, interval: float) -> RenderableType:
        parts: list[RenderableType] = []
        if self.lost is not None:
            since = time.strftime("%H:%M:%S", time.localtime(self.lost[0]))
            line = f"Redis does not answer since {since} ({self.lost[1]}); asking again every "
            parts.append(Text(f"{line}{interval:g} s", style="bold red"))
        if self.status is not None:
            parts.append(render_status(self.status, width))
        return Group(*parts)


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
            *(shown(row[field]) for field in ("id", "model", "status", "band", "user")),
            when,
            shown(row["endpoint"] or "-"),
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
