"""``fairq keda-scaler``: the KEDA external-push scaler's entry point (``scaler``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from fairq import runtime

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.command(
    name="keda-scaler",
    epilog=runtime.environment(*runtime.SERVICE, *runtime.metrics("keda scaler")),
)
@click.option("--host", default="127.0.0.1", show_default=True, help="0.0.0.0: every address")
@click.option("--port", default=9467, show_default=True, help="the gRPC port KEDA calls")
@click.option(
    "--poll-s",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="every model's demand is read at least this often (wake-ups read it at once)",
)
@click.option("--tls-cert", type=_FILE, default=None, help="serve TLS: certificate chain (PEM)")
@click.option("--tls-key", type=_FILE, default=None, help="serve TLS: its private key (PEM)")
@click.option(
    "--tls-client-ca", type=_FILE, default=None, help="require client certificates signed by it"
)
def keda_scaler(
    *,
    host: str,
    port: int,
    poll_s: float,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
) -> None:
    """Run KEDA's external-push scaler: each model's demand (queued + in flight) over
    gRPC, pushed to KEDA the moment a model's first job is queued."""
    from scaler import ScalerError, ScalerOptions, serve

    settings = runtime.start_service()
    options = ScalerOptions(host, port, poll_s, tls_cert, tls_key, tls_client_ca)
    try:
        options.credentials()  # bad TLS options: a configuration error, before any start
    except ScalerError as exc:
        runtime.fail_config(exc)

    async def main(stop: asyncio.Event) -> None:
        await serve(settings, options, stop)

    runtime.run_until_signalled(main)
