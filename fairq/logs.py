"""How every fairq process logs: one line per record on stderr, fairq's own records at the
configured level (``FAIRQ_LOG_LEVEL``, INFO by default), the libraries' at WARNING or the
configured level when that is higher.

A library's INFO lines are its chatter (RQ cleans its registries twice a second and
says so, httpx logs every engine request): at DEBUG they show too, their own DEBUG
lines never. Setting the libraries' logger levels is not enough to hold them: RQ sets
its loggers' levels itself as its worker and scheduler are built (its scheduler to
INFO, whatever was configured). So the one handler drops a library's record below its
floor whoever set the logger's level; the levels are set as well, so that a record
below them is not even made on a hot path.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Top-level packages whose loggers are fairq's own; every other logger is a library's.
OWN = frozenset({"fairq", "broker", "dispatcher", "workers", "gateway", "batch", "benchmarks"})
# Libraries that log below WARNING in fairq's processes: their levels are set at start.
CHATTY = ("rq", "httpx", "httpcore", "uvicorn", "asyncio", "multipart", "urllib3")


def parse_level(name: str) -> int:
    """A level name (any case) as its number; ValueError naming the choices."""
    level = logging.getLevelNamesMapping().get(name.strip().upper())
    if level is None or name.strip().upper() in ("NOTSET", "WARN", "FATAL"):
        raise ValueError(
            f"FAIRQ_LOG_LEVEL is {name!r}: it must be DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    return level


def library_level(level: int) -> int:
    """The lowest level a library's record is shown at, with fairq's own at ``level``."""
    return logging.INFO if level <= logging.DEBUG else max(level, logging.WARNING)


def is_own(logger_name: str) -> bool:
    return logger_name.partition(".")[0] in OWN


class _Floors(logging.Filter):
    def __init__(self, level: int) -> None:
        super().__init__()
        self.own = level
        self.library = library_level(level)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= (self.own if is_own(record.name) else self.library)


class _Handler(logging.StreamHandler[TextIO]):
    """The root's handler that ``setup`` installs (and replaces when called again)."""


def setup(level: int) -> None:
    """Log fairq's records at ``level`` and the libraries' at ``library_level(level)``."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    handler = _Handler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(_Floors(level))
    root.addHandler(handler)
    root.setLevel(level)
    hold_libraries()


def hold_libraries() -> None:
    """Raise every library logger whose level is set below its floor back to the floor
    (after a library set it: RQ's scheduler, built after ``setup``)."""
    floor = library_level(logging.getLogger().level)
    for name in CHATTY:
        logging.getLogger(name).setLevel(floor)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or is_own(name):
            continue  # a placeholder (a dotted name's parent no one asked for), or fairq's
        if logging.NOTSET < logger.level < floor:
            logger.setLevel(floor)
