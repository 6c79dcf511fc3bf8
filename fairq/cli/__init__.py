"""The ``fairq`` command: one entry point per component, and ``fairq up`` for all of them.

Exit codes: 0 done, 1 failed at run time, 2 bad configuration or usage
(``fairq.runtime``).
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import Any

import click

from broker import hash_key
from fairq import runtime

# The commands' modules, not their names: a command named as its module would hide the
# module behind it on this package (fairq.cli.views would be the command).
from fairq.cli import batch, config, keda_scaler, redis, up, views
from fairq.k8s.cli import k8s
from fairq.stack.processes import DEMO_MODELS


class _Main(click.Group):
    """The ``fairq`` group: a failure is one line naming what failed and what to check, and
    exit 1; ``fairq --debug ...`` shows the Python traceback instead."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click reports these itself (SystemExit and Ctrl-C are no Exception)
        except Exception as exc:
            if ctx.params.get("debug"):
                raise
            click.echo(f"fairq: {runtime.one_line(exc)}", err=True)
            click.echo("fairq: run again with `fairq --debug ...` for the traceback", err=True)
            sys.exit(1)


@click.group(cls=_Main)
@click.version_option(package_name="fairq", message="fairq %(version)s")
@click.option("--debug", is_flag=True, help="show the Python traceback of a failure")
def main(debug: bool) -> None:
    """fairq: a fair, priority-aware request queue for self-hosted LLM inference.

    \b
    Every command reads its settings from the environment and the configuration file:
      FAIRQ_CONFIG      the YAML configuration file (models, endpoints, keys, bands)
      FAIRQ_REDIS_URL   the Redis every component shares (redis:// or rediss://)
      FAIRQ_<SETTING>   any setting of the file, e.g. FAIRQ_METRICS_PORT=0
      FAIRQ_LOG_LEVEL   INFO by default (libraries' lines from WARNING)
    `fairq batch` talks to a gateway: FAIRQ_API_URL, FAIRQ_API_KEY (or OPENAI_API_KEY).
    """


@main.command(epilog=runtime.environment(*runtime.SERVICE))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True)
def api(host: str, port: int) -> None:
    """Run the OpenAI-compatible HTTP gateway."""
    from fairq.services import run_gateway

    run_gateway(runtime.start_service(), host, port)


@main.command(epilog=runtime.environment(*runtime.SERVICE, *runtime.metrics("dispatcher")))
def dispatcher() -> None:
    """Run a dispatcher for every configured model."""
    from fairq.services import run_dispatcher

    settings = runtime.start_service()
    runtime.run_until_signalled(lambda stop: run_dispatcher(settings, stop))


@main.command(
    epilog=runtime.environment(
        *runtime.SERVICE,
        *runtime.metrics("worker"),
        ("FAIRQ_WORKER_CONCURRENCY", "jobs at once, unless --concurrency [64]"),
    )
)
@click.option("--concurrency", type=int, default=None, help="jobs at once [settings: 64]")
def worker(concurrency: int | None) -> None:
    """Run a worker that executes dispatched jobs against the engines."""
    from fairq.services import run_worker

    settings = runtime.start_service()
    runtime.run_until_signalled(lambda stop: run_worker(settings, stop, concurrency))


@main.command(
    name="batch-worker",
    epilog=runtime.environment(*runtime.SERVICE, *runtime.metrics("batch worker")),
)
def batch_worker() -> None:
    """Run an RQ batch worker (queue fairq-batch): ingest, progress, finalize, expire."""
    from fairq.services import run_batch_worker

    settings = runtime.start_service()
    if settings.redis_cluster:
        runtime.fail_config(
            ValueError(
                "the batch worker runs on RQ, which does not support Redis Cluster "
                "(FAIRQ_REDIS_CLUSTER=true): run no batch workers against a cluster, or "
                "point this deployment at a single Redis (docs/operations.md, Redis Cluster)"
            )
        )
    run_batch_worker(settings)


main.add_command(batch.batch)


_SIM_STARTUP = ("FAIRQ_SIM_STARTUP_S", "--startup-s [0]")


@main.command(epilog=runtime.environment(runtime.LOG, _SIM_STARTUP))
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8100, show_default=True)
@click.option("--model", "models", multiple=True, required=True, help="served model name")
@click.option("--profile", default=None, help="profile YAML file [built-in default]")
@click.option(
    "--startup-s",
    type=click.FloatRange(min=0),
    default=0.0,
    envvar=_SIM_STARTUP[0],
    help="seconds of 503 on every route after start, as a pod loading its weights [0]",
)
def sim(
    host: str, port: int, models: tuple[str, ...], profile: str | None, startup_s: float
) -> None:
    """Run the engine simulator (a stand-in vLLM pod; its timings are estimates)."""
    from sim import ProfileError, load_profile, serve

    try:
        sim_profile = load_profile(profile)
    except ProfileError as exc:
        runtime.fail_config(exc)
    runtime.setup_logging()
    serve(host, port, list(models), sim_profile, startup_s=startup_s)


@main.command(name="hash-key", epilog=runtime.environment())
@click.argument("key")
def hash_key_cmd(key: str) -> None:
    """Print the sha256 to put in the config for an API key."""
    click.echo(hash_key(key))


class _Benchmarks(click.Group):
    """Loads a benchmark's module only when it runs: the harness (and matplotlib) stays
    out of every other ``fairq`` command's start-up."""

    _COMMANDS = {
        "fairness": "benchmarks.fairness.cli",
        "fleet": "benchmarks.fleet.cli",
        "prefix": "benchmarks.prefix.cli",
        "tenants": "benchmarks.tenants.cli",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module = self._COMMANDS.get(cmd_name)
        if module is None:
            return None
        command = importlib.import_module(module).main
        assert isinstance(command, click.Command)
        return command


@main.group(cls=_Benchmarks, epilog=runtime.environment())
def bench() -> None:
    """Benchmarks: fairq against its baseline, side by side in one run."""


main.add_command(k8s)
main.add_command(keda_scaler.keda_scaler)
main.add_command(config.config)
for _command in (views.status, views.top, views.jobs, views.job):
    main.add_command(_command)


@main.group(epilog=runtime.environment())
def demo() -> None:
    """Demos against a running `fairq up` (`make run`: nothing more to install)."""


@demo.command(epilog=runtime.environment())
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="the gateway")
@click.option("--model", default=DEMO_MODELS[0], show_default=True)
@click.option("--requests", default=100, show_default=True, help="alice's streamed requests")
@click.option("--max-tokens", default=1500, show_default=True, help="tokens per answer of alice's")
@click.option("--alice-key", default="fq-demo-alice", show_default=True)
@click.option("--bob-key", default="fq-demo-bob", show_default=True)
def newcomer(
    *, url: str, model: str, requests: int, max_tokens: int, alice_key: str, bob_key: str
) -> None:
    """alice floods the model with long answers, then bob sends one request: prints his
    time to first token and the estimated_wait_s his job showed while he waited."""
    from fairq.cli.demo import Flood
    from fairq.cli.demo import newcomer as run_demo

    flood = Flood(model=model, requests=requests, max_tokens=max_tokens)
    try:
        asyncio.run(run_demo(url.rstrip("/"), alice_key, bob_key, flood, say=click.echo))
    except Exception as exc:  # the CLI's edge: any failure is reported, exit 1
        click.echo(f"fairq demo: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)


main.add_command(up.up)
main.add_command(redis.redis)
