"""The operator's views show user-supplied text as it is: a trusted app's ``user`` value
(or a model, band, URL, job field) is neither rich markup nor terminal control codes. One
named ``[/]`` crashed ``fairq status`` (a closing tag with nothing open); one holding an
escape sequence could clear the operator's screen or retitle the terminal."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from fairq.cli.views import _jobs_table, render_status
from tests.fairq.test_top import _status

HOSTILE = "[/]"  # markup that crashes a parser
STYLED = "[bold red]alice[/bold red]"  # markup that would restyle a cell
ESCAPE = "\x1b]0;owned\x07\x1b[2J"  # retitles the terminal, clears the screen


def _shown(renderable: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=True, color_system=None).print(renderable)
    return out.getvalue()


def test_status_shows_hostile_user_band_model_and_url_as_text() -> None:
    status = _status(f"http://127.0.0.1:1/{HOSTILE}", batch_slots_disagree=STYLED)
    model = status["models"][0]
    model["model"] = f"m{HOSTILE}"
    for band in model["bands"]:
        band["top_users"] = [{"user": STYLED, "queued": 3}, {"user": HOSTILE + ESCAPE, "queued": 1}]
    model["bands"][0]["band"] = f"b{HOSTILE}"
    model["in_engine_users"] = [{"user": HOSTILE + ESCAPE, "jobs": 2}]
    shown = _shown(render_status(status, 200))
    assert STYLED in shown and f"m{HOSTILE}" in shown and f"b{HOSTILE}" in shown
    assert f"http://127.0.0.1:1/{HOSTILE}" in shown
    assert "\x1b]" not in shown and "\x1b[2J" not in shown and "\x07" not in shown


def test_the_jobs_table_shows_hostile_fields_as_text() -> None:
    row = {
        "id": f"job{HOSTILE}",
        "model": STYLED,
        "status": "queued",
        "band": "default",
        "user": HOSTILE + ESCAPE,
        "created_at_ms": 0,
        "endpoint": f"http://x/{STYLED}",
    }
    shown = _shown(_jobs_table([row], 1))
    assert f"job{HOSTILE}" in shown and STYLED in shown and f"http://x/{STYLED}" in shown
    assert HOSTILE in shown and "\x1b]" not in shown and "\x1b[2J" not in shown
