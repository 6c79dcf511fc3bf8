"""A configuration file checked as a person reads it: each problem with its line.

pydantic names a bad value by its path in the settings (``models[0].endpoints[0]``);
the YAML file's node tree (``yaml.compose``) knows where that path sits, so each
problem is reported as ``FILE:LINE: PATH: what is wrong``; a dependency between
settings (``broker.errors.SettingError``) is reported at the setting it names. The
settings a valid file writes in their old place (``Settings.notes``) are reported
alike, as notes (``moved``). The file is validated
alone (``check_file``), then with the ``FAIRQ_*`` environment over it
(``check_with_environment``), as every process reads it, so that a problem the
environment brings is not blamed on a line of the file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from broker import ModelConfig, Settings
from broker.errors import SettingError, dotted

_INPUT_SHOWN = 60  # characters of a rejected value repeated in its message


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration: where (a line of the file, a settings path)
    and what."""

    message: str
    path: str = ""
    line: int | None = None  # 1-based; None: not a place in the file

    def render(self, file: Path | str, label: str = "") -> str:
        """``FILE:LINE: [label: ]PATH: message``, without the parts it lacks."""
        where = f"{file}:{self.line}" if self.line is not None else str(file)
        return ": ".join(part for part in (where, label, self.path, self.message) if part)


class _FileOnly(Settings):
    """The settings from the given values alone: no environment, no FAIRQ_CONFIG."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def check_file(path: Path) -> tuple[Settings | None, list[Problem]]:
    """The settings the file alone gives, or the problems that stop it (each with its
    line where the file has one)."""
    try:
        text = path.read_text()
    except OSError as exc:
        return None, [Problem(f"cannot read the file ({exc.strerror or exc})")]
    except UnicodeDecodeError as exc:
        at = exc.object[: exc.start].count(b"\n") + 1
        return None, [Problem(f"not UTF-8 text (byte {exc.object[exc.start]:#04x})", line=at)]
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = None if mark is None else mark.line + 1
        return None, [Problem(f"not valid YAML: {exc.problem or exc.context}", line=line)]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        first = root.start_mark.line + 1 if root is not None else 1
        message = "must be a mapping of settings (name: value): fairq.example.yaml"
        return None, [Problem(message, line=first)]
    try:
        return _FileOnly(**data), []
    except ValidationError as exc:
        return None, problems(exc, root)


def check_with_environment(path: Path) -> tuple[Settings | None, list[Problem]]:
    """The settings a process started with ``FAIRQ_CONFIG=path`` reads (the ``FAIRQ_*``
    environment over a file valid alone), or the problems the environment brings."""
    saved = os.environ.get("FAIRQ_CONFIG")
    os.environ["FAIRQ_CONFIG"] = str(path)
    try:
        return Settings(), []
    except ValidationError as exc:
        return None, [
            Problem(f"{p.message} (set by the environment: {_env_names()})", p.path)
            for p in problems(exc, None)
        ]
    finally:
        if saved is None:
            del os.environ["FAIRQ_CONFIG"]
        else:
            os.environ["FAIRQ_CONFIG"] = saved


def environment_overrides() -> list[str]:
    """The ``FAIRQ_*`` variables that override the file's settings."""
    return [name for name in sorted(os.environ) if _is_setting(name)]


def _env_names() -> str:
    return ", ".join(environment_overrides()) or "none"


def _is_setting(name: str) -> bool:
    if not name.startswith("FAIRQ_") or name in ("FAIRQ_CONFIG", "FAIRQ_LOG_LEVEL"):
        return False
    field = name.removeprefix("FAIRQ_").lower().split("__")[0]
    return field in Settings.model_fields


def problems(exc: ValidationError, root: yaml.Node | None) -> list[Problem]:
    """Each of pydantic's errors as a ``Problem``, located in the YAML node tree ``root``."""
    found = []
    for error in exc.errors(include_url=False):
        loc = _setting(error)
        found.append(Problem(_message(error), dotted(loc), _line(root, loc)))
    return sorted(found, key=lambda p: (p.line is None, p.line or 0))


def _setting(error: Any) -> tuple[int | str, ...]:
    """Where pydantic places the error, and below it the setting a ``SettingError``
    names (a validator's error is placed at the object it checked)."""
    loc = tuple(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    return loc + cause.path if isinstance(cause, SettingError) else loc


def _message(error: Any) -> str:
    kind, message = error["type"], str(error["msg"])
    if kind == "extra_forbidden":
        return "not a setting of fairq (a typo? every setting is in fairq.example.yaml)"
    if kind == "missing":
        return "required, and missing"
    message = message.removeprefix("Value error, ")
    value = error.get("input")
    if kind != "value_error" and isinstance(value, str | int | float | bool):
        shown = repr(value)
        if len(shown) > _INPUT_SHOWN:
            shown = shown[: _INPUT_SHOWN - 3] + "..."
        message = f"{message} (got {shown})"
    return message


def _line(root: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The line of the deepest node on ``loc`` the file has (a missing field: its parent's);
    a key's own line for a mapping entry, so that an unknown key points at itself."""
    if root is None:
        return None
    node, line = root, None if not loc else root.start_mark.line + 1
    for part in loc:
        step = _child(node, part)
        if step is None:
            break
        key_line, node = step
        line = key_line
    return line


def _child(node: yaml.Node, part: int | str) -> tuple[int, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key.start_mark.line + 1, value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        item = node.value[part]
        return item.start_mark.line + 1, item
    return None


def explain(exc: ValidationError, config_path: str | None) -> tuple[str, list[Problem]]:
    """Where the problems behind ``exc`` (from loading the settings) come from, and them:
    the file's own, each with its line, else those the environment brought."""
    if config_path:
        _, found = check_file(Path(config_path))
        if found:
            return config_path, found
    return f"the environment ({_env_names()})", problems(exc, None)


def moved(path: Path, settings: Settings) -> list[Problem]:
    """The settings the file at ``path`` writes in their old place (``settings``: the
    file's alone, from ``check_file``), each with its line and where it goes."""
    root = yaml.compose(path.read_text())
    return [Problem(n.message, dotted(n.path), _line(root, n.path)) for n in settings.notes]


def notes(settings: Settings, *, redis: bool = True) -> list[str]:
    """What a valid configuration still lacks for a working stack (``redis``: a Redis URL
    too; ``fairq up`` starts its own)."""
    found = []
    if not settings.models:
        found.append("no models: every request would answer 404 (model_not_found)")
    if not settings.api_keys:
        found.append(
            "no api_keys: every request would answer 401; add one: `fairq hash-key KEY`, "
            "then an entry {sha256: <its output>, user: NAME} under api_keys"
        )
    if redis and settings.redis_url is None:
        found.append(
            "no redis_url (nor FAIRQ_REDIS_URL): `fairq up` starts a private Redis; "
            "every other command needs one"
        )
    return found


def summary(settings: Settings) -> str:
    models = ", ".join(f"{m.name} ({m.engine}, {_serving(m)})" for m in settings.models)
    users = ", ".join(k.user for k in settings.api_keys)
    return (
        f"{len(settings.models)} model(s): {models or '-'}; "
        f"{len(settings.api_keys)} API key(s): {users or '-'}; "
        f"bands {' > '.join(settings.bands)}"
    )


def _serving(model: ModelConfig) -> str:
    """Where the model's engines are: its endpoints listed, found through DNS, or both."""
    parts = []
    if model.endpoints:
        parts.append(f"{len(model.endpoints)} endpoint{'s' * (len(model.endpoints) > 1)}")
    if model.discovery is not None:
        found = model.discovery
        parts.append(f"replicas of DNS {found.dns} port {found.port}")
    return " + ".join(parts)
