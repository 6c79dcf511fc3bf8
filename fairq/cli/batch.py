"""``fairq batch``: submit a JSONL file as an OpenAI batch, follow it, fetch its results.

Talks to a gateway over HTTP (``--api-url``, default ``$FAIRQ_API_URL`` or
http://127.0.0.1:8000) with the key in ``$FAIRQ_API_KEY`` (or ``$OPENAI_API_KEY``).
``FILE`` may hold OpenAI batch lines (``{custom_id, method, url, body}``) or bare
request bodies (``{"messages": [...]}``), which are wrapped with ids ``line-N``;
``--model`` fills in the model of every body that names none.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import httpx
import orjson
from tqdm import tqdm

from fairq.runtime import environment

_TERMINAL = ("completed", "failed", "expired", "cancelled")
_ENV = environment(
    ("FAIRQ_API_URL", "the fairq gateway, unless --api-url [http://127.0.0.1:8000]"),
    ("FAIRQ_API_KEY", "the API key, unless --api-key [none]"),
    ("OPENAI_API_KEY", "the API key when FAIRQ_API_KEY is not set [none]"),
)
_POLL_S = 1.0


def _client(ctx: click.Context) -> httpx.Client:
    api_url, key = ctx.obj["api_url"], ctx.obj["api_key"]
    if not key:
        raise click.UsageError("set FAIRQ_API_KEY (or OPENAI_API_KEY) or pass --api-key")
    return httpx.Client(
        base_url=f"{api_url.rstrip('/')}/v1",
        timeout=60.0,
        headers={"Authorization": f"Bearer {key}"},
    )


def _check(response: httpx.Response) -> Any:
    if response.is_error:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:500]
        raise click.ClickException(f"{response.status_code}: {message}")
    return response.json()


def _gateway_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--api-url`` and ``--api-key`` on a subcommand too (``fairq batch submit --api-key
    K``), over the group's values when given."""

    def keep(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None and param.name is not None:
            ctx.ensure_object(dict)[param.name] = value

    command = click.option(
        "--api-key", default=None, expose_value=False, callback=keep, help="API key"
    )(command)
    return click.option(
        "--api-url", default=None, expose_value=False, callback=keep, help="the fairq gateway"
    )(command)


@click.group(epilog=_ENV)
@click.option(
    "--api-url",
    envvar="FAIRQ_API_URL",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="the fairq gateway [$FAIRQ_API_URL]",
)
@click.option(
    "--api-key",
    envvar=["FAIRQ_API_KEY", "OPENAI_API_KEY"],
    default=None,
    help="API key [$FAIRQ_API_KEY, else $OPENAI_API_KEY]",
)
@click.pass_context
def batch(ctx: click.Context, api_url: str, api_key: str | None) -> None:
    """OpenAI-compatible batches: submit, status, results, cancel."""
    ctx.obj = {"api_url": api_url, "api_key": api_key}


_BAD_LINES_SHOWN = 5  # lines named one by one; the rest counted


def _normalise(line: bytes, number: int, model: str | None, endpoint: str) -> bytes | str:
    """The line in batch form, or why it cannot be put in it (it is then sent as it is)."""
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"is not valid JSON ({exc})"
    if not isinstance(item, dict):
        return "is not a JSON object"
    if "body" not in item:
        item = {"custom_id": f"line-{number}", "method": "POST", "url": endpoint, "body": item}
    if model and isinstance(item["body"], dict):
        item["body"].setdefault("model", model)
    return orjson.dumps(item) + b"\n"


def _prepared(path: Path, model: str | None, endpoint: str) -> tuple[Path, list[str]]:
    """A copy of the file with every line in batch form (line by line, never whole), and
    what is wrong with each line that is not: such a line is sent as it is, and the batch
    records it as a failed line with that reason (its error file), as the server does for
    any file; one bad line does not keep the others from running."""
    out = tempfile.NamedTemporaryFile("wb", suffix=".jsonl", delete=False)  # noqa: SIM115
    bad: list[str] = []
    with path.open("rb") as src, out:
        for number, line in enumerate(src, start=1):
            if not line.strip():
                continue
            normal = _normalise(line, number, model, endpoint)
            if isinstance(normal, str):
                bad.append(f"line {number} {normal}")
                normal = line if line.endswith(b"\n") else line + b"\n"
            out.write(normal)
    return Path(out.name), bad


def _warn(bad: list[str]) -> None:
    for problem in bad[:_BAD_LINES_SHOWN]:
        click.echo(f"fairq batch: {problem}: sent as it is, a failed line of the batch", err=True)
    if len(bad) > _BAD_LINES_SHOWN:
        click.echo(f"fairq batch: and {len(bad) - _BAD_LINES_SHOWN} more such lines", err=True)


def _upload(client: httpx.Client, path: Path, name: str) -> str:
    size = path.stat().st_size
    with (
        path.open("rb") as raw,
        tqdm.wrapattr(raw, "read", total=size, desc="upload", file=sys.stderr) as reader,
    ):
        files = {"file": (name, reader, "application/jsonl")}
        uploaded = _check(client.post("/files", data={"purpose": "batch"}, files=files))
    return str(uploaded["id"])


@batch.command(epilog=_ENV)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model", default=None, help="model for every request that names none")
@click.option(
    "--endpoint",
    default="/v1/chat/completions",
    show_default=True,
    type=click.Choice(["/v1/chat/completions", "/v1/completions"]),
)
@click.option("--wait", is_flag=True, help="follow the batch to its end with a progress bar")
@_gateway_options
@click.pass_context
def submit(ctx: click.Context, file: Path, model: str | None, endpoint: str, wait: bool) -> None:
    """Upload FILE and start a batch over it; prints the batch id. A line that is not a
    JSON object is sent as it is (and named): the batch records it as a failed line."""
    prepared, bad = _prepared(file, model, endpoint)
    _warn(bad)
    try:
        with _client(ctx) as client:
            file_id = _upload(client, prepared, file.name)
            created = _check(
                client.post(
                    "/batches",
                    json={
                        "input_file_id": file_id,
                        "endpoint": endpoint,
                        "completion_window": "24h",
                    },
                )
            )
            click.echo(created["id"])
            if wait:
                final = _follow(client, created["id"])
                click.echo(f"{final['id']}: {final['status']} {final['request_counts']}")
    finally:
        prepared.unlink(missing_ok=True)


def _follow(client: httpx.Client, batch_id: str) -> dict[str, Any]:
    with tqdm(desc="requests", unit="req", file=sys.stderr) as bar:
        while True:
            current = _check(client.get(f"/batches/{batch_id}"))
            counts = current["request_counts"]
            bar.total = counts["total"] or None
            bar.n = counts["completed"] + counts["failed"]
            bar.set_postfix(status=current["status"], failed=counts["failed"])
            if current["status"] in _TERMINAL:
                return dict(current)
            time.sleep(_POLL_S)


@batch.command(epilog=_ENV)
@click.argument("batch_id")
@_gateway_options
@click.pass_context
def status(ctx: click.Context, batch_id: str) -> None:
    """Print the batch object (JSON)."""
    with _client(ctx) as client:
        current = _check(client.get(f"/batches/{batch_id}"))
    click.echo(orjson.dumps(current, option=orjson.OPT_INDENT_2).decode())


def _download(client: httpx.Client, file_id: str, path: Path) -> None:
    with client.stream("GET", f"/files/{file_id}/content") as response, path.open("wb") as out:
        if response.is_error:
            response.read()
            _check(response)
        for block in response.iter_bytes():
            out.write(block)


@batch.command(epilog=_ENV)
@click.argument("batch_id")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="where to write the output file (JSONL)",
)
@click.option(
    "--errors",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="where to write the error file [OUTPUT with .errors.jsonl]",
)
@_gateway_options
@click.pass_context
def results(ctx: click.Context, batch_id: str, output: Path, errors: Path | None) -> None:
    """Download the batch's output file (and its error file, if any)."""
    with _client(ctx) as client:
        current = _check(client.get(f"/batches/{batch_id}"))
        if current["status"] not in _TERMINAL:
            raise click.ClickException(f"batch {batch_id} is {current['status']}: not ended yet")
        output.write_bytes(b"")
        if current.get("output_file_id"):
            _download(client, current["output_file_id"], output)
        if current.get("error_file_id"):
            errors = errors or output.with_suffix(".errors.jsonl")
            _download(client, current["error_file_id"], errors)
            click.echo(f"errors: {errors}", err=True)
    counts = current["request_counts"]
    click.echo(f"{output}: {counts['completed']} completed, {counts['failed']} failed")


@batch.command(name="cancel", epilog=_ENV)
@click.argument("batch_id")
@_gateway_options
@click.pass_context
def cancel_cmd(ctx: click.Context, batch_id: str) -> None:
    """Cancel the batch (queued requests are dropped, running ones finish)."""
    with _client(ctx) as client:
        current = _check(client.post(f"/batches/{batch_id}/cancel"))
    click.echo(f"{batch_id}: {current['status']}")
