"""fairq.logs: fairq's own lines at the configured level, a library's at WARNING or above
(its INFO too at DEBUG), whatever level the library gives its own logger. Each case runs
in a process of its own, as the root logger is the process's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from fairq import logs
from tests.support.cli import fairq

_LINES = """
import logging
from fairq import logs

logs.setup(logs.parse_level({level!r}))
{after_setup}
for name in ("dispatcher.service", "rq.worker", "rq.scheduler", "httpx", "somelib"):
    for level in (logging.DEBUG, logging.INFO, logging.WARNING):
        logging.getLogger(name).log(level, "%s at %s", name, logging.getLevelName(level))
"""


def _printed(level: str, after_setup: str = "") -> set[str]:
    code = _LINES.format(level=level, after_setup=textwrap.dedent(after_setup))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == ""
    return {line.split(": ", 1)[1] for line in done.stderr.splitlines()}


def _of(names: tuple[str, ...], *levels: str) -> set[str]:
    return {f"{name} at {level}" for name in names for level in levels}


LIBRARIES = ("rq.worker", "rq.scheduler", "httpx", "somelib")


@pytest.mark.parametrize(
    ("level", "own", "library"),
    [
        ("DEBUG", ("DEBUG", "INFO", "WARNING"), ("INFO", "WARNING")),
        ("INFO", ("INFO", "WARNING"), ("WARNING",)),
        ("warning", ("WARNING",), ("WARNING",)),
        ("ERROR", (), ()),
    ],
)
def test_fairqs_lines_follow_the_level_and_a_librarys_stay_at_warning_or_above(
    level: str, own: tuple[str, ...], library: tuple[str, ...]
) -> None:
    expected = _of(("dispatcher.service",), *own) | _of(LIBRARIES, *library)
    assert _printed(level) == expected


def test_a_library_lowering_its_level_after_setup_prints_nothing_below_warning() -> None:
    # RQ's scheduler sets its logger to INFO when it is built (the batch worker builds
    # one after logging is set up); its "Acquired scheduler lock" line is INFO.
    after_setup = """
        import fakeredis
        from rq.scheduler import RQScheduler

        RQScheduler(["fairq-batch"], connection=fakeredis.FakeRedis())
        assert logging.getLogger("rq.scheduler").level == logging.INFO
        """
    printed = _printed("WARNING", after_setup)
    assert printed == _of(("dispatcher.service", *LIBRARIES), "WARNING")


def test_library_levels_and_their_floor() -> None:
    assert logs.library_level(10) == 20 and logs.library_level(20) == 30
    assert logs.library_level(40) == 40
    assert logs.is_own("workers.runner") and not logs.is_own("rq.scheduler")


@pytest.mark.parametrize("name", ["LOUD", "warn", "NOTSET", ""])
def test_an_unknown_level_is_refused_naming_the_choices(name: str) -> None:
    with pytest.raises(ValueError, match="DEBUG, INFO, WARNING, ERROR or CRITICAL"):
        logs.parse_level(name)


def test_a_service_with_an_unknown_level_exits_2_saying_so() -> None:
    done = fairq("sim", "--model", "m", "--port", "9", env={"FAIRQ_LOG_LEVEL": "LOUD"})
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "fairq: configuration error: FAIRQ_LOG_LEVEL is 'LOUD': it must be DEBUG, INFO, "
        "WARNING, ERROR or CRITICAL"
    )
