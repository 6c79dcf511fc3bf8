"""How the local stack's child processes start (``preexec_fn``, between fork and exec).

A child dies with its parent (Linux PR_SET_PDEATHSIG), so a parent killed outright
leaves nothing behind. The kernel sends that signal when the *thread* that started the
child ends, so a parent starts its children from a thread that lives as long as they do
(``fairq.stack.Stack`` owns one). SIGINT and SIGTERM are reset to their defaults: a
shell's background job runs with SIGINT ignored, and an ignored signal stays ignored
across exec, so a child would never see the Ctrl-C (or the test's SIGINT) meant for it.
A server the stack stops itself, after everything that uses it (the private Redis),
ignores SIGINT instead (``start_server``): a Ctrl-C at the terminal reaches the whole
process group, and a Redis gone first would fail the components still draining.
Only ctypes calls: no Python locks are taken after the fork.
"""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1
_SIG_DFL, _SIG_IGN = 0, 1


def default_signals() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for sig in (signal.SIGINT, signal.SIGTERM):
        libc.signal(sig, _SIG_DFL)


def start_child() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    default_signals()


def start_server() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    libc.signal(signal.SIGINT, _SIG_IGN)
    libc.signal(signal.SIGTERM, _SIG_DFL)
