"""The built image answers a chat completion: its own ``fairq sim``, ``dispatcher``,
``worker`` and ``api`` started from it, the official openai client on the host.

Each component runs in a working container of the image (``buildah from``) under
``buildah run`` with chroot isolation and the host's network, as the image's user
10001 with the image's environment; the configuration is mounted read-only, as a
Kubernetes ConfigMap would be. Redis is the test session's private server on
127.0.0.1: a deployment runs Redis from an image of its own (deploy/k8s/redis).
Skipped where no image is built: ``make image`` builds it (``FAIRQ_IMAGE`` names another).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from fairq.stack.localredis import free_port
from fairq.stack.processes import DEMO_KEYS, demo_api_keys
from tests.support.processes import ProcessGroups
from tests.support.stack import wait_healthy

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("FAIRQ_IMAGE", "fairq:0.1.0")  # buildah: localhost/fairq:0.1.0
MODEL = "demo-chat"
KEY = next(iter(DEMO_KEYS))
START_S = 60.0  # buildah run sets up each container, then Python starts


def _missing() -> str | None:
    """Why the image cannot be run here, or None."""
    if shutil.which("buildah") is None:
        return "buildah is not installed: `make image` installs it and builds the image"
    if os.geteuid() != 0:
        return "buildah runs the image as root here (no rootless setup)"
    found = subprocess.run(
        ["buildah", "images", "--quiet", IMAGE], check=False, capture_output=True
    )
    if found.returncode != 0 or not found.stdout.strip():
        return f"no built image {IMAGE}: `make image` builds it"
    return None


@pytest.fixture
def container() -> Iterator[str]:
    """A working container of the image, removed after the test."""
    if (reason := _missing()) is not None:
        pytest.skip(reason)
    name = f"fairq-image-test-{uuid.uuid4().hex[:8]}"
    command = ["buildah", "from", "--pull=never", "--name", name, IMAGE]
    subprocess.run(command, check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], check=False, capture_output=True)


class Image:
    """Components of the image, each ``fairq ARGS`` in the working container."""

    def __init__(self, container: str, config_dir: Path, redis_url: str) -> None:
        self.container = container
        self.started: list[subprocess.Popen[bytes]] = []
        self.volume = f"{config_dir}:/etc/fairq:ro"
        self.env = {
            "FAIRQ_CONFIG": "/etc/fairq/fairq.yaml",
            "FAIRQ_REDIS_URL": redis_url,
            "FAIRQ_METRICS_PORT": "0",  # no /metrics servers: nothing to clash on
            "FAIRQ_LOG_LEVEL": "WARNING",
        }

    def run(self, groups: ProcessGroups, *args: str) -> subprocess.Popen[bytes]:
        env = [f"--env={name}={value}" for name, value in self.env.items()]
        options = ["--isolation=chroot", "--network=host", f"--volume={self.volume}", *env]
        command = ["buildah", "run", *options, self.container, "--", "fairq", *args]
        process: subprocess.Popen[bytes] = groups.start(command)
        self.started.append(process)
        return process

    def users(self) -> list[set[int]]:
        """Per component started, the real user ids of its fairq processes."""
        found = []
        for process in self.started:
            children = psutil.Process(process.pid).children(recursive=True)
            found.append({c.uids().real for c in children if "/opt/fairq/bin/fairq" in c.cmdline()})
        return found


def _config_dir(tmp_path: Path, sim_port: int) -> Path:
    """The configuration, readable by the image's user 10001."""
    config = {
        "models": [
            {"name": MODEL, "engine": "vllm", "endpoints": [f"http://127.0.0.1:{sim_port}"]}
        ],
        "api_keys": demo_api_keys(),
    }
    directory = tmp_path / "config"
    directory.mkdir()
    (directory / "fairq.yaml").write_text(yaml.safe_dump(config))
    directory.chmod(0o755)
    (directory / "fairq.yaml").chmod(0o644)
    return directory


def test_the_built_image_answers_a_chat_completion_through_the_openai_client(
    container: str, redis_url: str, processes: ProcessGroups, tmp_path: Path
) -> None:
    sim_port, api_port = free_port(), free_port()
    image = Image(container, _config_dir(tmp_path, sim_port), redis_url)
    sim = image.run(processes, "sim", "--port", str(sim_port), "--model", MODEL)
    wait_healthy(f"http://127.0.0.1:{sim_port}/health", sim, "the image's sim", START_S)
    image.run(processes, "dispatcher")
    image.run(processes, "worker")
    api = image.run(processes, "api", "--host", "127.0.0.1", "--port", str(api_port))
    wait_healthy(f"http://127.0.0.1:{api_port}/readyz", api, "the image's gateway", START_S)
    assert image.users() == [{10001}] * 4, "each component runs as the image's user 10001"

    client = OpenAI(base_url=f"http://127.0.0.1:{api_port}/v1", api_key=KEY, timeout=30)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16)
    assert answer.model == MODEL
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")

    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text
