"""``fairq up``'s console: every component's lines under its name, one line per state
change, and the banner kept on the screen.

Each child's output arrives line by line (``Stack.on_output``) and is printed with the
child's name; its log time keeps only the clock (``12:00:01 worker-0  INFO ...``). The
stack's state changes (started, ready) are one line each. The banner (the URL, the keys,
a curl to try, the export lines) is printed again once the lines after it would have
pushed it off a terminal of the console's size and the log has been quiet for
``quiet_s``, or at once when the user presses Enter.
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from fairq.cli.visible import visible

QUIET_S = 5.0
_NAME_WIDTH = 16
_LOG_STAMP = re.compile(r"^\d{4}-\d\d-\d\d (\d\d:\d\d:\d\d),\d{3} ")


def rows(lines: Sequence[str], columns: int) -> int:
    """The terminal rows ``lines`` take at ``columns`` wide (long lines wrap)."""
    return sum(max(1, math.ceil(len(line) / columns)) for line in lines)


class Console:
    """Thread-safe: children's relays, the stack's events and the main loop print here."""

    def __init__(
        self,
        out: TextIO | None = None,
        *,
        quiet_s: float = QUIET_S,
        clock: Callable[[], float] = time.monotonic,
        size: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self._out = out or sys.stdout
        self._quiet_s = quiet_s
        self._clock = clock
        self._size = size or _terminal_size
        self._lock = threading.Lock()
        self._banner: list[str] = []
        self._rows_since = 0  # terminal rows printed after the banner
        self._last_at = clock()
        self._wanted = False

    def output(self, name: str, line: str) -> None:
        """One line a component wrote, with no control sequence of its own (``visible``)."""
        line = visible(line)
        stamp = _LOG_STAMP.match(line)
        if stamp:
            self._print(f"{stamp.group(1)} {name:<{_NAME_WIDTH}} {line[stamp.end() :]}")
        else:
            self._print(f"{'':8} {name:<{_NAME_WIDTH}} {line}")

    def event(self, name: str, what: str) -> None:
        """One line for a component's change of state."""
        self._print(f"{time.strftime('%H:%M:%S')} {name:<{_NAME_WIDTH}} {what}")

    def say(self, text: str) -> None:
        """A line of ``fairq up``'s own."""
        self._print(text)

    def show_banner(self, lines: Sequence[str]) -> None:
        with self._lock:
            self._banner = list(lines)
            self._write_banner()

    def want_banner(self) -> None:
        """Print the banner at the next ``tick`` (the user pressed Enter)."""
        self._wanted = True

    def tick(self) -> None:
        """Print the banner again if it is wanted, or if it is off the screen and the log
        has been quiet for ``quiet_s``."""
        with self._lock:
            if not self._banner or not (self._wanted or self._scrolled_off_and_quiet()):
                return
            self._write_banner()

    def _scrolled_off_and_quiet(self) -> bool:
        if not self._rows_since or self._clock() - self._last_at < self._quiet_s:
            return False
        columns, height = self._size()
        return rows(self._banner, columns) + self._rows_since > height

    def _write_banner(self) -> None:
        self._wanted = False
        self._rows_since = 0
        self._out.write("\n".join(["", *self._banner, ""]))
        self._out.flush()

    def _print(self, text: str) -> None:
        with self._lock:
            self._out.write(text + "\n")
            self._out.flush()
            self._last_at = self._clock()
            if self._banner:
                self._rows_since += rows([text], self._size()[0])


def _terminal_size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return size.columns, size.lines


def watch_enter(console: Console) -> None:
    """On a terminal, each Enter asks for the banner (a daemon thread reads the lines)."""
    if not sys.stdin.isatty():
        return

    def read() -> None:
        for _ in sys.stdin:
            console.want_banner()

    threading.Thread(target=read, name="fairq-enter", daemon=True).start()
