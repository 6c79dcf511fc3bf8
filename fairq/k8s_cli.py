"""``fairq k8s``: render the per-model manifests; probe a pod that serves no HTTP."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from fairq.runtime import CONFIG, REDIS, SETTING, environment


@click.group(epilog=environment())
def k8s() -> None:
    """Kubernetes: the manifests under deploy/k8s, and the probe of pods without HTTP."""


@k8s.command(epilog=environment())
@click.option(
    "--dir",
    "k8s_dir",
    default="deploy/k8s",
    show_default=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
)
@click.option("--check", is_flag=True, help="only compare; exit 1 if a generated file is stale")
def render(k8s_dir: Path, check: bool) -> None:
    """Write base/fairq.yaml, engines/ and the KEDA triggers from DIR/fairq.yaml."""
    from pydantic import ValidationError

    from fairq import k8s as generator

    try:
        if check:
            stale = generator.stale(k8s_dir)
            for path in stale:
                click.echo(f"stale: {k8s_dir / path} (run `fairq k8s render`)", err=True)
            sys.exit(1 if stale else 0)
        for path in generator.write(k8s_dir):
            click.echo(f"wrote {k8s_dir / path}")
    except (ValidationError, ValueError, KeyError) as exc:
        click.echo(f"fairq: {k8s_dir / 'fairq.yaml'}: {exc}", err=True)
        sys.exit(2)


@k8s.command(epilog=environment(CONFIG, REDIS, SETTING))
@click.option("--timeout", "timeout_s", default=2.0, show_default=True, help="seconds")
def probe(timeout_s: float) -> None:
    """Readiness of a dispatcher or worker pod: the configuration loads and Redis answers."""
    from fairq.runtime import settings_or_exit

    settings = settings_or_exit()  # exits 2 on a bad configuration

    async def ping() -> None:
        from broker import connect

        redis = connect(settings)
        try:
            async with asyncio.timeout(timeout_s):
                await redis.ping()
        finally:
            await redis.aclose()

    try:
        asyncio.run(ping())
    except Exception as exc:  # any failure means "not ready"; say which
        click.echo(f"fairq: Redis does not answer PING ({type(exc).__name__}: {exc})", err=True)
        sys.exit(1)
