"""A real ``fairq dispatcher`` process for a test, with its /metrics on a free port."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from fairq.stack.localredis import free_port
from tests.support.processes import ProcessGroups
from tests.support.stack import wait_healthy


@contextlib.contextmanager
def dispatcher_process(config: dict[str, Any], redis_url: str, folder: Path) -> Iterator[str]:
    """``fairq dispatcher`` reading ``config`` (written to ``folder``) until the block ends,
    killed whole then, pass or fail; yields the URL its /metrics is served at."""
    (folder / "fairq.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    env = {**os.environ, "FAIRQ_CONFIG": str(folder / "fairq.yaml"),
           "FAIRQ_REDIS_URL": redis_url, "FAIRQ_LOG_LEVEL": "WARNING",
           "FAIRQ_METRICS_PORT": str(port), "FAIRQ_METRICS_HOST": "127.0.0.1"}  # fmt: skip
    groups = ProcessGroups()
    try:
        proc = groups.start([sys.executable, "-m", "fairq", "dispatcher"], env=env)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{url}/metrics", proc, "the dispatcher")
        yield url
    finally:
        groups.kill_all()
