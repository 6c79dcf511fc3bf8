"""``fairq k8s``: render the per-model manifests; probe a pod that serves no HTTP; drain
an engine pod before it stops."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from fairq.runtime import CONFIG, REDIS, SETTING, environment


@click.group(epilog=environment())
def k8s() -> None:
    """Kubernetes: the manifests under deploy/k8s, the probe of pods without HTTP, and the
    drain an engine pod runs before it stops."""


_DIR_OPTION = click.option(
    "--dir",
    "k8s_dir",
    default=None,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="deploy/k8s [that of the checkout the current folder is in, else of this install]",
)


def _k8s_dir(given: Path | None) -> Path:
    from fairq.k8s import render as generator

    found = given or generator.find_dir(Path.cwd())
    if found is None or not (found / "fairq.yaml").is_file():
        where = found or Path.cwd()
        raise click.UsageError(f"no fairq.yaml in {where}: pass --dir path/to/deploy/k8s")
    return found


def _shown(path: Path) -> str:
    """A path as the user can use it: relative to the current folder where it is inside."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@k8s.command(epilog=environment())
@_DIR_OPTION
@click.option("--check", is_flag=True, help="only compare; exit 1 if a generated file is stale")
def render(k8s_dir: Path | None, check: bool) -> None:
    """Write base/fairq.yaml, components/api-keys/api-keys.yaml (the Secret of the API keys,
    their hashes only), the simulator's demo Secrets, engines/ and the KEDA triggers from
    DIR/fairq.yaml; files that would not change are left as they are and reported
    unchanged. Refuses (exit 2) while a known secret (a demo key's hash, a demo or
    placeholder password) is anywhere but the simulator overlay, naming its line."""
    from pydantic import ValidationError

    from fairq.k8s import render as generator
    from fairq.k8s import secrets as k8s_secrets

    directory = _k8s_dir(k8s_dir)
    shown = Path(_shown(directory))
    known = k8s_secrets.problems(directory)
    for problem in known:
        click.echo(f"fairq k8s render: {shown / problem}", err=True)
    if known:
        sys.exit(2)
    try:
        if check:
            stale = generator.stale(directory)
            for path in stale:
                click.echo(f"stale: {shown / path} (run `fairq k8s render`)", err=True)
            sys.exit(1 if stale else 0)
        done = generator.write(directory)
        for path, what in done.items():
            click.echo(f"{what:<9} {shown / path}")
    except (ValidationError, ValueError, KeyError) as exc:
        click.echo(f"fairq k8s render: {shown / 'fairq.yaml'}: {exc}", err=True)
        sys.exit(2)
    if done.get(generator.API_KEYS_FILE, "removed") == "removed":
        click.echo(
            f"fairq k8s render: note: {shown / 'fairq.yaml'} lists no api_keys, so the "
            "production overlays (overlays/production, overlays/external-redis) do not build: "
            f"no request would be accepted. Make a key: fairq k8s add-key USER --dir {shown}",
            err=True,
        )


@k8s.command(name="add-key", epilog=environment())
@click.argument("user")
@click.option("--tenant", default=None, help="the user's tenant [the user is its own]")
@click.option("--admin", is_flag=True, help="may read /v1/admin and the dashboard")
@_DIR_OPTION
def add_key(user: str, tenant: str | None, admin: bool, k8s_dir: Path | None) -> None:
    """Make a random API key for USER: print it once, and add its SHA-256 (never the key)
    to the api_keys of DIR/fairq.yaml. Then `fairq k8s render` puts it in the Secret."""
    from fairq.k8s import keys as k8s_keys

    directory = _k8s_dir(k8s_dir)
    key = k8s_keys.new_key()
    entry = k8s_keys.key_entry(user, key, tenant=tenant, admin=admin)
    try:
        k8s_keys.add_key(directory / "fairq.yaml", entry)
    except k8s_keys.KeysError as exc:
        click.echo(f"fairq k8s add-key: {exc}", err=True)
        sys.exit(2)
    click.echo(f"API key of {user} (shown once; keep it, fairq stores only its hash): {key}")
    click.echo(f"added to {_shown(directory / 'fairq.yaml')}; now run `fairq k8s render`")


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


@k8s.command(epilog=environment())
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="the engine")
@click.option("--settle-s", default=0.0, show_default=True, help="wait this long first")
@click.option("--timeout-s", default=600.0, show_default=True, help="give up after this")
@click.option("--interval-s", default=1.0, show_default=True, help="read /metrics this often")
def drain(url: str, settle_s: float, timeout_s: float, interval_s: float) -> None:
    """An engine pod's preStop hook: return once the engine at URL runs and holds no
    request (vllm:num_requests_running + waiting = 0), or exit 1 after TIMEOUT_S."""
    from fairq.k8s.drain import drain as run

    sys.exit(
        run(
            url,
            settle_s=settle_s,
            timeout_s=timeout_s,
            interval_s=interval_s,
            say=lambda line: click.echo(line, err=True),
        )
    )


@k8s.command(name="install-drain", epilog=environment())
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def install_drain(directory: Path) -> None:
    """Copy the drain hook, a script of the standard library only, to
    DIRECTORY/fairq_drain.py: an init container does this for engine images without
    fairq (vLLM), whose preStop then runs `python3 DIRECTORY/fairq_drain.py`."""
    from fairq.k8s.drain import install

    click.echo(f"wrote {install(directory)}")
