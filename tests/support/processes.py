"""Processes a test starts: each in a process group of its own, killed whole when the
test ends, whether it passed or failed.

``processes.start(args)`` is ``subprocess.Popen`` with a new session (so the child and
everything it starts share one process group) and SIGINT and SIGTERM at their
defaults (a test session started from a shell's background job runs with SIGINT
ignored, and the child would inherit that). The fixture's finalizer sends SIGKILL to
every group a test started. ``no_process_left`` (autouse, tests/conftest.py) is the net
under every other test: a descendant of this test process started during a test and
still alive after it is killed, and the test fails naming it; a session fixture's process
(``for_the_session``), which may start during whichever test first asks for it, is not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

import psutil
import pytest

from fairq.stack.children import default_signals

_GRACE_S = 5.0  # a process being stopped as the test ends gets this long to exit
_SESSION_PIDS: set[int] = set()  # processes session fixtures started: they outlive tests


def for_the_session(pid: int) -> None:
    """``pid`` belongs to a session fixture (e.g. the session's Redis): it outlives the
    test that first asked for it, and the net lets it be."""
    _SESSION_PIDS.add(pid)


class ProcessGroups:
    def __init__(self) -> None:
        self.started: list[subprocess.Popen[Any]] = []

    def start(self, args: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        process = subprocess.Popen(
            args,
            start_new_session=True,
            preexec_fn=default_signals,  # noqa: PLW1509 - ctypes calls only, no locks
            **popen,
        )
        self.started.append(process)
        return process

    def kill_all(self) -> None:
        for process in self.started:
            kill_group(process)


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL to ``process``'s whole group (it leads one: ``start_new_session``), then
    its pipes closed."""
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


@pytest.fixture
def processes() -> Iterator[ProcessGroups]:
    groups = ProcessGroups()
    try:
        yield groups
    finally:
        groups.kill_all()


def descendants() -> set[psutil.Process]:
    return set(psutil.Process().children(recursive=True))


@pytest.fixture(autouse=True)
def no_process_left() -> Iterator[None]:
    before = descendants()
    yield
    left = [p for p in descendants() - before if p.pid not in _SESSION_PIDS and _alive(p)]
    if not left:
        return
    _, alive = psutil.wait_procs(left, timeout=_GRACE_S)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=_GRACE_S)
    if alive:
        pytest.fail(f"the test left processes running (now killed): {_describe(alive)}")


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(found: list[psutil.Process]) -> str:
    out = []
    for process in found:
        try:
            out.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
        except psutil.Error:
            out.append(str(process.pid))
    return "; ".join(out)
