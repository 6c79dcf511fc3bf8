"""The API keys of a Kubernetes deployment: ``api_keys`` in ``deploy/k8s/fairq.yaml``,
each key only as its SHA-256, rendered into the Secret ``fairq-api-keys`` that the
gateway reads as ``FAIRQ_API_KEYS``.

``secret`` refuses a configuration with no key (no request would be accepted after
the first apply) or with a key in the clear, naming the command that makes one:
``fairq k8s add-key USER`` draws a random key, prints it once, and appends its hash to
``fairq.yaml``, keeping the file's comments (a text edit, checked by parsing the result).
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from broker import hash_key
from broker.settings import ApiKeyConfig

SECRET_NAME = "fairq-api-keys"
SECRET_KEY = "api_keys.json"
_TOP_KEY = re.compile(r"^api_keys\s*:\s*(?P<value>[^#]*?)\s*(#.*)?$")


class KeysError(ValueError):
    """The configuration's API keys cannot be rendered; the message says what to run."""


def make_key_command(k8s_dir: Path | str) -> str:
    return f"fairq k8s add-key USER --dir {k8s_dir}"


def secret(entries: object, k8s_dir: Path | str) -> dict[str, Any]:
    """The Secret of ``entries`` (``api_keys`` of the source file), each checked."""
    if not entries:
        raise KeysError(
            f"{k8s_dir}/fairq.yaml lists no api_keys, so no request would be accepted after "
            f"deploying. Make one (its key is printed once): {make_key_command(k8s_dir)}"
        )
    if not isinstance(entries, list):
        raise KeysError("api_keys must be a list of {sha256, user, ...} entries")
    for i, entry in enumerate(entries):
        _check(i, entry, k8s_dir)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET_NAME},
        "type": "Opaque",
        # FAIRQ_API_KEYS of the gateway: the entries as JSON, keys as hashes only.
        "stringData": {SECRET_KEY: json.dumps(entries, separators=(",", ":"))},
    }


def _check(index: int, entry: object, k8s_dir: Path | str) -> None:
    if isinstance(entry, dict) and ("key" in entry or "api_key" in entry):
        raise KeysError(
            f"api_keys[{index}] holds a key in the clear: only its sha256 goes in "
            f"fairq.yaml (`fairq hash-key KEY`), or make a new one: {make_key_command(k8s_dir)}"
        )
    try:
        ApiKeyConfig.model_validate(entry)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise KeysError(f"api_keys[{index}].{where}: {problem['msg']}") from exc


def new_key() -> str:
    return f"fq-{secrets.token_urlsafe(24)}"


def add_key(source: Path, entry: dict[str, Any]) -> None:
    """Append ``entry`` to the ``api_keys`` list of ``source``, keeping its comments."""
    text = source.read_text()
    before = (yaml.safe_load(text) or {}).get("api_keys") or []
    edited = _with_entry(text.splitlines(), json.dumps(entry))
    after = (yaml.safe_load(edited) or {}).get("api_keys")
    if after != [*before, entry]:
        raise KeysError(
            f"could not add the key to {source} by itself: add this entry under "
            f"api_keys by hand: {json.dumps(entry)}"
        )
    source.write_text(edited)


def _with_entry(lines: list[str], flow: str) -> str:
    """The file's lines with ``- flow`` as the last item of its top-level ``api_keys``."""
    start = next((i for i, line in enumerate(lines) if _TOP_KEY.match(line)), None)
    if start is None:
        return "\n".join([*lines, "", "api_keys:", f"  - {flow}", ""])
    value = _TOP_KEY.match(lines[start]).group("value")  # type: ignore[union-attr]
    if value in ("", "[]", "null", "~"):
        lines[start] = "api_keys:"
    else:
        raise KeysError("api_keys is written inline: make it a block list (one - per key)")
    end, indent = start, "  "
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line.startswith((" ", "-", "#")):
            break  # the next top-level key
        if line.lstrip().startswith("- ") and end == start:
            indent = line[: len(line) - len(line.lstrip())]
        if line.strip() and not line.lstrip().startswith("#"):
            end = i
    return "\n".join([*lines[: end + 1], f"{indent}- {flow}", *lines[end + 1 :], ""])


def key_entry(user: str, key: str, *, tenant: str | None, admin: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"sha256": hash_key(key), "user": user}
    if tenant:
        entry["tenant"] = tenant
    if admin:
        entry["admin"] = True
    return entry
