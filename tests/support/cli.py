"""The ``fairq`` command run as a user runs it: a real process, with no FAIRQ_* or
OPENAI_* variable of the test session's, only the ones a test gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RUN_S = 60


def fairq(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRQ_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "fairq", *args],
        env=clean | (env or {}),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )
