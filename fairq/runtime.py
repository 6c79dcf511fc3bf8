"""What every ``fairq`` command shares: the settings (or exit 2), logging, and running
one long-lived asyncio service under signals.

SIGINT and SIGTERM set a stop event (the service drains and returns); a second
signal exits at once. Only the CLI decides exit codes: 0 done, 1 failed at run time,
2 bad configuration or usage (``settings_or_exit``, ``fail_config``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn

import click
import httpx
from pydantic import ValidationError

from broker import Settings, load_settings
from broker.errors import dotted
from broker.telemetry import METRICS_PORTS
from fairq import logs

# What each command reads from the environment, for its --help (``environment``).
CONFIG = ("FAIRQ_CONFIG", "the YAML configuration: engines, models, keys [none: no models]")
REDIS = ("FAIRQ_REDIS_URL", "the Redis every component shares [required]")
SETTING = ("FAIRQ_<SETTING>", "any setting, over the file's (`fairq config settings`)")
LOG = ("FAIRQ_LOG_LEVEL", "DEBUG, INFO, WARNING, ERROR or CRITICAL [INFO]")
SERVICE = (CONFIG, REDIS, SETTING, LOG)


def metrics(component: str) -> tuple[tuple[str, str], ...]:
    """The variables of a component's /metrics server (``broker.telemetry.serve_metrics``)."""
    port = METRICS_PORTS[component]
    return (
        (
            "FAIRQ_METRICS_PORT",
            f"its Prometheus /metrics port, 0: none [{port}; a free one if taken]",
        ),
        ("FAIRQ_METRICS_HOST", "the address it listens on; 0.0.0.0: every one [127.0.0.1]"),
    )


def environment(*variables: tuple[str, str]) -> str:
    """The ``Environment:`` section of a command's help: each variable it reads, what for,
    and its default in brackets."""
    if not variables:
        return "Environment: none read."
    width = max(len(name) for name, _ in variables) + 2
    lines = [f"  {name:<{width}}{what}" for name, what in variables]
    return "\b\nEnvironment:\n" + "\n".join(lines)


def settings_or_exit() -> Settings:
    """The settings, or exit 2 with the configuration error (a bad file's problems each
    with its line: ``fairq.config_check``)."""
    settings = _load_or_exit()
    try:
        settings.require_redis_url()
    except ValueError as exc:
        fail_config(exc)
    return settings


def start_service() -> Settings:
    """What a long-running process does first: logging set up, the settings loaded (or
    exit 2, as ``settings_or_exit``), and each setting its configuration writes in an
    old place logged once (``fairq config check`` names their lines)."""
    setup_logging()
    settings = settings_or_exit()
    log = logging.getLogger("fairq.config")
    for note in settings.notes:
        log.info("configuration note: %s: %s", dotted(note.path), note.message)
    return settings


def _load_or_exit() -> Settings:
    try:
        return load_settings()
    except ValidationError as exc:
        from fairq.config_check import explain

        source, found = explain(exc, os.environ.get("FAIRQ_CONFIG"))
        for problem in found:
            click.echo(f"fairq: configuration error: {problem.render(source)}", err=True)
        sys.exit(2)
    except (ValueError, FileNotFoundError) as exc:
        fail_config(exc)


def stack_settings_or_exit(command: str) -> Settings:
    """The settings of a command that reads a running stack (``fairq status``, ``top``,
    ``jobs``, ``job``): without a Redis URL or a model there is nothing to show, so it
    exits 2 saying which is missing, rather than showing an empty stack."""
    config = os.environ.get("FAIRQ_CONFIG")
    missing = []
    if not config:
        missing.append("FAIRQ_CONFIG (the configuration that names the models)")
    settings = _load_or_exit()
    if settings.redis_url is None:
        missing.append("FAIRQ_REDIS_URL (the stack's Redis)")
    if missing:
        fail_config(
            ValueError(
                f"fairq {command} needs {' and '.join(missing)}: `fairq up` prints the "
                "export lines for its stack; for your own, export FAIRQ_CONFIG=your.yaml "
                "FAIRQ_REDIS_URL=redis://host:6379/0"
            )
        )
    if not settings.models:
        fail_config(ValueError(f"FAIRQ_CONFIG ({config}) lists no models: nothing to show"))
    return settings


def one_line(exc: BaseException) -> str:
    """A failure as one line a person can act on: what could not be reached, and where."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return (
            f"cannot reach Redis ({exc}); is it running, and is FAIRQ_REDIS_URL right? "
            "(`fairq redis` starts a private one)"
        )
    if isinstance(exc, httpx.TransportError):
        try:
            where = str(exc.request.url)
        except RuntimeError:  # an error raised before its request was made
            where = "the server"
        return f"cannot reach {where} ({type(exc).__name__}: {exc}); is it running?"
    return f"{type(exc).__name__}: {exc}"


def fail_config(exc: Exception) -> NoReturn:
    click.echo(f"fairq: configuration error: {exc}", err=True)
    sys.exit(2)


def setup_logging() -> None:
    """Log at ``FAIRQ_LOG_LEVEL`` (``fairq.logs``: the libraries at WARNING or above);
    an unknown level is a configuration error (exit 2)."""
    try:
        level = logs.parse_level(os.environ.get("FAIRQ_LOG_LEVEL", "INFO"))
    except ValueError as exc:
        fail_config(exc)
    logs.setup(level)


def run_until_signalled(main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                os._exit(130)  # second signal: the operator insists
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        await main(stop)

    with asyncio.Runner(loop_factory=_loop_factory()) as loop_runner:
        loop_runner.run(runner())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed: less CPU per event on the streaming hot path."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
