"""``fairq config check FILE``: a configuration file checked before any process meets it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fairq.runtime import SETTING, environment


@click.group(epilog=environment(SETTING))
def config() -> None:
    """The configuration file (FAIRQ_CONFIG): check one before you deploy it."""


@config.command(epilog=environment(SETTING))
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def check(file: Path) -> None:
    """Check FILE as every fairq process reads it: each problem with its line and the
    setting's path, exit 2; a valid file: its models, keys and bands, exit 0. The
    FAIRQ_<SETTING> variables override the file, as in every process; a problem they
    bring is named as theirs."""
    from fairq.config_check import check_file, check_with_environment, notes, summary

    settings, found = check_file(file)
    if settings is not None:
        settings, found = check_with_environment(file)
    for problem in found:
        click.echo(problem.render(file), err=True)
    if found or settings is None:
        sys.exit(2)
    click.echo(f"{file}: valid: {summary(settings)}")
    for note in notes(settings):
        click.echo(f"{file}: note: {note}")
