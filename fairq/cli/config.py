"""``fairq config``: a configuration file checked before any process meets it
(``check``), and every setting described (``example``, ``settings``: what
fairq.example.yaml and the README's settings table are generated from)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fairq.runtime import SETTING, environment

_WRITE = click.Path(dir_okay=False, path_type=Path)


@click.group(epilog=environment(SETTING))
def config() -> None:
    """The configuration file (FAIRQ_CONFIG): check one before you deploy it, or see
    every setting."""


@config.command(epilog=environment(SETTING))
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def check(file: Path) -> None:
    """Check FILE as every fairq process reads it: each problem with its line and the
    setting's path, exit 2; a valid file: its models, keys and bands, and a note for each
    setting written in its old place, exit 0. The FAIRQ_<SETTING> variables override the
    file, as in every process; a problem they bring is named as theirs."""
    from fairq.config_check import check_file, check_with_environment, moved, notes, summary

    alone, found = check_file(file)
    settings = alone
    if alone is not None:
        settings, found = check_with_environment(file)
    for problem in found:
        click.echo(problem.render(file), err=True)
    if found or alone is None or settings is None:
        sys.exit(2)
    click.echo(f"{file}: valid: {summary(settings)}")
    for note in moved(file, alone):
        click.echo(note.render(file, "note"))
    for lack in notes(settings):
        click.echo(f"{file}: note: {lack}")


@config.command(epilog=environment())
@click.option("--write", "path", type=_WRITE, help="Write it to this file instead.")
def example(path: Path | None) -> None:
    """Print fairq.example.yaml: every setting at its default, described, by concern
    (`make docs` rewrites the file)."""
    from fairq.config_docs import example_yaml

    _out(example_yaml(), path)


@config.command(epilog=environment())
@click.option(
    "--write", "path", type=_WRITE, help="Put it between the table's markers in this file."
)
def settings(path: Path | None) -> None:
    """Print the settings table (markdown): every setting, its default and what it does,
    by concern, as README.md's Configuration shows it (`make docs` rewrites it there)."""
    from fairq.config_docs import settings_table, with_table

    if path is None:
        _out(settings_table(), None)
        return
    try:
        _out(with_table(path.read_text(), settings_table()), path)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{path}: {exc}") from exc


def _out(text: str, path: Path | None) -> None:
    if path is None:
        click.echo(text, nl=False)
    else:
        path.write_text(text)
