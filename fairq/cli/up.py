"""``fairq up``: the whole stack on this machine, on the demo, the user's configuration,
or the user's engine (``fairq.stack.upconfig``), with a console that keeps its banner in view
(``fairq.cli.console``)."""

from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from fairq.cli.console import Console, watch_enter
from fairq.runtime import environment
from fairq.stack.localredis import RedisServerError, claim_port
from fairq.stack.owner import owner_of
from fairq.stack.processes import Stack
from fairq.stack.upconfig import ENGINES, Plan, PlanError, demo_plan, engine_plan, file_plan

_HELP = """Run the whole stack locally: Redis, the engines, a dispatcher, workers, a batch
worker and the gateway, each its own process; Ctrl-C stops everything.

\b
What it serves:
  (nothing)             two simulated engines (demo-chat, demo-code) and demo keys
  --config FILE         your models, keys and engines (FAIRQ_CONFIG: the same);
                        `fairq config check FILE` first names each problem's line
  --engine-url URL      any OpenAI-compatible engine (a real vLLM) behind the demo
                        keys; the model from its /v1/models unless --model is given,
                        its /metrics scraped when it has vLLM's or TGI's

It prints the export lines that let `fairq status`, `top` and `jobs` see this stack.
Its private Redis is its own: another `fairq up` given its URL (a shell holding those
export lines) refuses to start. If that Redis dies, it is started again over its files;
if it dies again within a minute, or any component exits, the stack stops (exit 1).
"""
_WATCH_S = 0.5  # how often the children and the private Redis are looked at
REDIS_RESTART_WINDOW_S = 60.0  # the private Redis exiting again this soon ends the stack
_ENV = environment(
    ("FAIRQ_CONFIG", "as --config [none: the demo]"),
    ("FAIRQ_REDIS_URL", "as --redis-url [none: a private Redis, gone at exit]"),
    ("FAIRQ_<SETTING>", "overrides a setting of the configuration, in every process"),
    ("FAIRQ_LOG_LEVEL", "the components' log level [INFO]"),
)


@click.command(help=_HELP, epilog=_ENV)
@click.option("--port", default=8000, show_default=True, help="gateway port on 127.0.0.1")
@click.option(
    "--config",
    "config_file",
    envvar="FAIRQ_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="your configuration file [env FAIRQ_CONFIG; default: the demo]",
)
@click.option(
    "--engine-url",
    "engine_urls",
    multiple=True,
    help="an engine's base URL (repeat it for more pods of the model)",
)
@click.option("--model", default=None, help="--engine-url's model [from its /v1/models]")
@click.option(
    "--engine",
    type=click.Choice(["auto", *ENGINES]),
    default="auto",
    show_default=True,
    help="--engine-url's kind; auto: from its /metrics",
)
@click.option("--sim-port", default=None, type=int, help="demo: first simulator port [free ports]")
@click.option(
    "--redis-url",
    envvar="FAIRQ_REDIS_URL",
    default=None,
    help="use this Redis [env FAIRQ_REDIS_URL; default: a private one]",
)
@click.option("--workers", default=1, show_default=True)
@click.pass_context
def up(
    ctx: click.Context,
    *,
    port: int,
    config_file: Path | None,
    engine_urls: tuple[str, ...],
    model: str | None,
    engine: str,
    sim_port: int | None,
    redis_url: str | None,
    workers: int,
) -> None:
    claim_port(port)  # the simulators, Redis and /metrics ports keep off the gateway's
    try:
        plan = _plan(ctx, config_file, engine_urls, model=model, engine=engine, sim_port=sim_port)
    except PlanError as exc:
        for line in exc.lines:
            click.echo(f"fairq up: {line}", err=True)
        sys.exit(2)
    _refuse_another_stacks_redis(ctx, redis_url or plan.redis_url, plan)
    # Started with SIGINT ignored (a shell's background job), Ctrl-C would never stop it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    console = Console()
    for note in plan.notes:
        console.say(f"fairq up: note: {note}")
    stack = Stack(
        config=plan.config,
        config_file=plan.config_file,
        gateway_port=port,
        sims=plan.sims,
        redis_url=redis_url or plan.redis_url,
        workers=workers,
        on_output=console.output,
        on_event=console.event,
    )
    _run(stack, plan, console)


def _plan(
    ctx: click.Context,
    config_file: Path | None,
    engine_urls: tuple[str, ...],
    *,
    model: str | None,
    engine: str,
    sim_port: int | None,
) -> Plan:
    from_env = ctx.get_parameter_source("config_file") == ParameterSource.ENVIRONMENT
    if engine_urls:
        if config_file is not None and not from_env:
            raise click.UsageError("--config and --engine-url: one or the other")
        if config_file is not None:
            click.echo(f"fairq up: FAIRQ_CONFIG ({config_file}) is not used: --engine-url "
                       "puts the demo keys in front of your engine", err=True)  # fmt: skip
        return engine_plan(engine_urls, model, engine)
    if model is not None or engine != "auto":
        raise click.UsageError("--model and --engine go with --engine-url")
    if config_file is None:
        return demo_plan(sim_port)
    if not config_file.is_file():
        source = "FAIRQ_CONFIG" if from_env else "--config"
        raise PlanError(
            f"{source} names {config_file}, which is not a file"
            + (" (unset FAIRQ_CONFIG to run the demo)" if from_env else "")
        )
    return file_plan(config_file)


def _refuse_another_stacks_redis(ctx: click.Context, url: str | None, plan: Plan) -> None:
    """Exit 2 when ``url`` is another ``fairq up``'s private Redis (``fairq.stack.owner``
    says why a second stack never joins it), naming what to undo."""
    owner = None if url is None else owner_of(url)
    if owner is None:
        return
    source = ctx.get_parameter_source("redis_url")
    if source == ParameterSource.ENVIRONMENT:
        ours = os.environ.get("FAIRQ_CONFIG") == owner.config
        what, undo = "FAIRQ_REDIS_URL", f"`unset FAIRQ_REDIS_URL{' FAIRQ_CONFIG' * ours}`"
    elif source == ParameterSource.COMMANDLINE:
        what, undo = "--redis-url", "leave out --redis-url"
    else:
        what, undo = f"redis_url of {plan.config_file}", "remove it from the file"
    click.echo(
        f"fairq up: {what} is the private Redis of the fairq up at pid {owner.pid} "
        f"({owner.gateway_url}), gone when it stops: a second stack would mix its jobs into "
        f"that stack's queues; {undo} to start a stack of its own",
        err=True,
    )
    sys.exit(2)


def _run(stack: Stack, plan: Plan, console: Console) -> None:
    try:
        stack.start()
        console.show_banner(banner(stack, plan))
        watch_enter(console)
        console.say(f"fairq up: {_watch(stack, console)}; stopping the stack")
        sys.exit(1)
    except KeyboardInterrupt:
        console.say("fairq up: stopping")
    finally:
        stack.stop()
    console.say("fairq up: stopped")


def _watch(stack: Stack, console: Console) -> str:
    """Watch the stack until it cannot go on; returns why, as a line. A child that exits
    ends it; the private Redis that exits is started again over its files, but exiting
    again within ``REDIS_RESTART_WINDOW_S`` of that ends it (a Redis that cannot stay up)."""
    restarted_at = -math.inf
    while True:
        time.sleep(_WATCH_S)
        console.tick()
        if (dead := stack.dead()) is not None:
            return f"{dead} {_ended(stack.processes[dead].returncode)}"
        if (code := stack.redis_exit_code()) is None:
            continue
        if time.monotonic() - restarted_at < REDIS_RESTART_WINDOW_S:
            # A server killed logs nothing of it; one that exited logged why.
            why = "" if code < 0 else f" (its log: {stack.redis_last_words()})"
            return f"redis {_ended(code)} again within {REDIS_RESTART_WINDOW_S:g} s{why}"
        console.event("redis", f"{_ended(code)}: starting it again over its files "
                      "(what it wrote in its last second may be lost)")  # fmt: skip
        try:
            stack.restart_redis()
        except RedisServerError as exc:
            return f"redis {_ended(code)} and did not start again ({exc})"
        restarted_at = time.monotonic()
        console.event("redis", f"ready at {stack.redis_url} again")


def _ended(code: int | None) -> str:
    """How a process ended: ``exited (code 1)``, ``was killed (SIGKILL)``."""
    if code is not None and code < 0:
        return f"was killed ({signal.Signals(-code).name})"
    return f"exited (code {code})"


def banner(stack: Stack, plan: Plan) -> list[str]:
    """What the user needs at hand while the stack runs; at most one screen."""
    url = stack.gateway_url
    again = "; Enter shows this again" if sys.stdin.isatty() else ""
    lines = [
        f"fairq is up: {url}/v1   (Ctrl-C stops everything{again})",
        "models:",
        *(f"  {line}" for line in plan.models),
        "API keys:" if plan.keys else "API keys: none (every request answers 401)",
        *(f"  {line}" for line in plan.keys),
        "try:",
        f"  curl -N {url}/v1/chat/completions \\",
        f"    -H 'Authorization: Bearer {plan.try_key}' -H 'Content-Type: application/json' \\",
        f'    -d \'{{"model": "{plan.try_model}", "stream": true,',
        '         "messages": [{"role": "user", "content": "Hello"}]}\'',
    ]
    if plan.admin_key:
        lines.append(f"dashboard: {url}/dashboard#key={plan.admin_key}")
    lines += [f"config: {stack.config_path}", *export_lines(stack)]
    return lines


def export_lines(stack: Stack) -> list[str]:
    """The lines that make `fairq status`, `top` and `jobs` in another shell see ``stack``."""
    lines = ["fairq status, top and jobs in another shell, after:"]
    here = Path(sys.executable).parent
    if (here / "fairq").exists() and shutil.which("fairq") != str(here / "fairq"):
        lines.append(f'  export PATH={shlex.quote(str(here))}:"$PATH"')
    lines.append(f"  export FAIRQ_CONFIG={shlex.quote(str(stack.config_path))}")
    url = stack.redis_url or ""
    if urlsplit(url).password:
        shown = url.replace(f":{urlsplit(url).password}@", ":****@")
        lines.append(f"  export FAIRQ_REDIS_URL='{shown}'  # your URL; its password not shown")
    else:
        lines.append(f"  export FAIRQ_REDIS_URL={shlex.quote(url)}")
    return lines
