"""The part of this machine's pip configuration that a container build can use.

    python3 deploy/image/pipconf.py OUT

Reads the effective configuration (``pip config list``: the config files and the
``PIP_*`` environment variables, the environment first) and writes to OUT a pip.conf
with the package index settings (index URL, extra index URLs, trusted hosts, proxy,
timeout, retries). Local paths (``file://`` indexes, ``find-links`` directories) are
left out: they do not exist inside the build. When pip is given a CA bundle (``cert``),
its path on this machine is printed. The build mounts both as secrets (ids ``pip-conf``
and ``pip-ca``) in the one step that runs pip: they reach no layer of the image.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

KEYS = ("index-url", "extra-index-url", "trusted-host", "proxy", "default-timeout", "retries")
SECTIONS = (":env:", "install", "global")  # pip's precedence, highest first


def effective() -> dict[str, str]:
    """Each setting's value from the highest section that sets it."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    found: dict[tuple[str, str], str] = {}
    for line in listed.splitlines():
        name, sep, value = line.partition("=")
        section, dot, key = name.rpartition(".")
        if sep and dot:
            found[section, key] = str(ast.literal_eval(value))
    settings = {}
    for key in (*KEYS, "cert"):
        for section in SECTIONS:
            if (section, key) in found:
                settings[key] = found[section, key]
                break
    return settings


def remote(value: str) -> str:
    """The URLs of a space- or newline-separated list that are not local files."""
    return " ".join(url for url in value.split() if not url.startswith("file:"))


def main(out: Path) -> None:
    settings = effective()
    lines = ["[global]"]
    for key in KEYS:
        value = remote(settings.get(key, ""))
        if value:
            lines.append(f"{key} = {value}")
    ca = settings.get("cert", "")
    if ca and Path(ca).is_file():
        print(ca)
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
