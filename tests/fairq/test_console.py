"""``fairq up``'s console on hand-made clocks and screens: each component's line under its
name, and the banner printed again once it is off the screen and the log is quiet, or
when the user presses Enter."""

from __future__ import annotations

import io

from fairq.cli.console import Console, rows

BANNER = ["fairq is up: http://127.0.0.1:8000/v1", "API keys:", "  fq-demo-alice"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def console(height: int = 10) -> tuple[Console, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    return Console(out, quiet_s=5.0, clock=clock, size=lambda: (80, height)), out, clock


def test_a_components_log_line_keeps_its_clock_and_gets_its_name() -> None:
    con, out, _ = console()
    con.output("worker-0", "2026-01-02 12:00:01,123 INFO fairq: worker w serving models: m")
    con.output("api", "Traceback (most recent call last):")
    assert out.getvalue().splitlines() == [
        "12:00:01 worker-0         INFO fairq: worker w serving models: m",
        "         api              Traceback (most recent call last):",
    ]


def test_the_banner_comes_back_once_pushed_off_the_screen_and_the_log_is_quiet() -> None:
    con, out, clock = console(height=10)
    con.show_banner(BANNER)
    for i in range(8):  # 1 blank + 3 banner rows + 8 lines: past 10 rows
        con.output("worker-0", f"line {i}")
    clock.now += 4.9
    con.tick()
    assert out.getvalue().count("fairq is up") == 1  # not quiet long enough yet
    clock.now += 0.2
    con.tick()
    assert out.getvalue().count("fairq is up") == 2
    assert out.getvalue().splitlines()[-3:] == BANNER
    clock.now += 60
    con.tick()
    assert out.getvalue().count("fairq is up") == 2  # nothing new: once is enough


def test_the_banner_is_not_repeated_while_it_is_still_on_the_screen() -> None:
    con, out, clock = console(height=24)
    con.show_banner(BANNER)
    con.output("dispatcher-0", "2026-01-02 12:00:01,123 INFO owns models: m")
    clock.now += 60
    con.tick()
    assert out.getvalue().count("fairq is up") == 1


def test_enter_asks_for_the_banner_at_once() -> None:
    con, out, _ = console()
    con.show_banner(BANNER)
    con.want_banner()
    con.tick()
    assert out.getvalue().count("fairq is up") == 2


def test_long_lines_take_the_rows_they_wrap_to() -> None:
    assert rows(["x" * 80, "x" * 81, ""], 80) == 1 + 2 + 1


def test_a_components_line_reaches_the_terminal_without_its_control_sequences() -> None:
    # A line that would retitle the terminal and clear the screen is shown, not obeyed.
    con, out, _ = console()
    con.output("api", "user \x1b]0;owned\x07\x1b[2J said hello\tthere")
    (line,) = out.getvalue().splitlines()
    assert "\x1b" not in line and "\x07" not in line and "\t" not in line
    assert line.endswith("user \\x1b]0;owned\\x07\\x1b[2J said hello\\tthere")
