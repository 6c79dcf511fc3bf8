"""The Makefile as a new user meets it (``make -n``: what each target would run, nothing
run): ``make run`` installs what running needs and nothing else, ``make test`` and
``make lint`` install their extras, and ``make test`` says what it installs and why."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def dry_run(target: str, tmp_path: Path) -> list[str]:
    """The commands ``make TARGET`` would run on a fresh clone (no virtual environment)."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    # Run under `make test` (CI), the outer make's variables would make this one a sub-make
    # that prints "make[1]: Entering directory" around its commands.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target, "BROWSER=yes"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.splitlines()


def test_make_run_installs_only_what_running_needs(tmp_path: Path) -> None:
    lines = dry_run("run", tmp_path)
    installs = [line for line in lines if " install " in line and "pip" in line]
    assert installs[-1].endswith("pip install --quiet -e .")  # no extras
    assert lines[-1] == ".venv/bin/fairq up"


@pytest.mark.parametrize("target", ["test", "lint"])
def test_make_test_and_lint_install_the_extras_they_need(target: str, tmp_path: Path) -> None:
    lines = dry_run(target, tmp_path)
    assert any(line.endswith("pip install --quiet -e '.[test,dev,bench]'") for line in lines)


def test_make_test_says_what_it_installs_and_why(tmp_path: Path) -> None:
    text = "\n".join(dry_run("test", tmp_path))
    assert "make: installing fairq with its test, dev and bench extras" in text
    says = text.index("installing Debian's chromium (apt-get, as root) for tests/integration")
    assert says < text.index("apt-get install")  # said before it is done
    assert "BROWSER=no skips it" in text
