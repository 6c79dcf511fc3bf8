"""Models that name their engine, resolved into the whole ``ModelConfig`` fairq reads.

In the file a model names an entry of ``engines`` (``engine: gpu-a``) and says only what
is its own. Here, once, as the settings load (``Settings``' validator), each such model
gets its engine's settings copied in, so that every other part reads one flat model as
before; models that name one engine get one engine's settings, so they agree by
construction (``broker.engines`` still checks the rest).

The old form loads too: a model whose ``engine`` is a kind (or absent) and which lists its
engine's settings itself (``endpoints``, ``batch_slots``, ...) is taken as it is, and an
engine setting on a model that names an engine is read over the engine's. Each such
setting gets a note (``SettingNote``) saying where it goes.

Pure: the raw input in; out the input resolved, its notes, and the errors of models
whose engine cannot be resolved.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from broker.errors import SettingError, SettingPath
from broker.settings.engine import KINDS, EngineConfig, EngineSettings

# Each engine setting as a model entry of the old form names it -> as an engine entry does.
ENGINE_ON_MODEL = {
    "engine": "kind",
    "engine_priority": "scheduling",
    **{name: name for name in EngineSettings.model_fields},
}

# Where an old-form model's engine setting goes ({setting}: as the engine's entry writes it).
_TO_NEW_ENTRY = "an entry of engines ({setting}) and give the model engine: <that entry's name>"


@dataclass(frozen=True)
class SettingNote:
    """A setting written in its old place: where it is (its path in the settings) and
    where it goes."""

    path: SettingPath
    message: str


@dataclass(frozen=True)
class Resolution:
    data: dict[str, Any]  # the input, each model that names an engine made whole
    notes: tuple[SettingNote, ...] = ()
    errors: tuple[SettingError, ...] = ()  # why models' engines cannot be resolved
    unresolved: frozenset[int] = frozenset()  # those models, and those of invalid engines

    def hides(self, loc: SettingPath) -> bool:
        """Whether pydantic's error at ``loc`` is one of an unresolved model's, left as
        written: its engine's errors, or ``errors``, say what is wrong, once."""
        return len(loc) > 1 and loc[0] == "models" and loc[1] in self.unresolved


def resolve(data: Mapping[str, Any]) -> Resolution:
    """``data`` with each model entry that names an entry of ``engines`` made whole; a
    model whose engine cannot be resolved (or is not valid) is left as written."""
    models = data.get("models")
    if not isinstance(models, list | tuple):
        return Resolution(dict(data))
    engines = _engines(data.get("engines"))
    resolved: list[object] = []
    notes: list[SettingNote] = []
    errors: list[SettingError] = []
    unresolved = set()
    for index, entry in enumerate(models):
        if not isinstance(entry, Mapping):  # a ModelConfig already, or pydantic's to refuse
            resolved.append(entry)
            continue
        model, found, error = _model(index, entry, engines)
        resolved.append(entry if model is None else model)
        notes += found
        errors += [error] if error is not None else []
        if model is None:
            unresolved.add(index)
    whole = {**data, "models": resolved}
    return Resolution(whole, tuple(notes), tuple(errors), frozenset(unresolved))


def _engines(raw: object) -> dict[str, tuple[int, EngineConfig | None]]:
    """Each entry of ``engines`` by its name, with its place: validated, or None when it is
    not valid. The first of a name counts (the settings refuse a second)."""
    found: dict[str, tuple[int, EngineConfig | None]] = {}
    for place, entry in enumerate(raw if isinstance(raw, list | tuple) else ()):
        if isinstance(entry, EngineConfig):
            found.setdefault(entry.name, (place, entry))
        elif isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            try:
                engine: EngineConfig | None = EngineConfig.model_validate(entry)
            except ValidationError:
                engine = None
            found.setdefault(entry["name"], (place, engine))
    return found


def _model(
    index: int, entry: Mapping[str, Any], engines: Mapping[str, tuple[int, EngineConfig | None]]
) -> tuple[Mapping[str, Any] | None, list[SettingNote], SettingError | None]:
    """The model entry at ``index`` resolved (None: it cannot be), its notes, and why it
    cannot be (None: its engine's own errors say)."""
    named = entry.get("engine")
    if not isinstance(named, str) or named in KINDS:  # the old form (or pydantic's to refuse)
        notes = [_moved(index, key, value, _TO_NEW_ENTRY) for key, value in entry.items()]
        return entry, [note for note in notes if note is not None], None
    try:
        place, engine = _named(index, entry, named, engines)
    except SettingError as error:
        return None, [], error
    if engine is None:
        return None, [], None
    own = {key: value for key, value in entry.items() if key != "engine"}
    to = f"engines[{place}] ({named}) as {{setting}}"
    notes = [_moved(index, key, value, to) for key, value in own.items()]
    return {**_from_engine(engine), **own}, [note for note in notes if note is not None], None


def _named(
    index: int,
    entry: Mapping[str, Any],
    named: str,
    engines: Mapping[str, tuple[int, EngineConfig | None]],
) -> tuple[int, EngineConfig | None]:
    """The engine the model entry at ``index`` names, and its place; raises
    ``SettingError`` when there is none of that name, or the entry says where it is."""
    if named not in engines:
        known = ", ".join(engines) or "none"
        raise SettingError(
            ("models", index, "engine"),
            f"{named!r} is neither the name of an entry of engines ({known}) nor a kind of "
            f"engine ({', '.join(KINDS)}): name the entry of engines that serves the model",
        )
    place, engine = engines[named]
    for key in ("endpoints", "discovery"):
        if key in entry:
            raise SettingError(
                ("models", index, key),
                f"the model names engine {named!r} (engines[{place}]), which says where the "
                f"engine is: remove {key} here, or move it to engines[{place}]",
            )
    return place, engine


def _from_engine(engine: EngineConfig) -> dict[str, Any]:
    """The settings the engine's entry gives, under the names of ``ModelConfig``: only
    those it writes, so that a model's checks of what was written see what was."""
    given = {
        model: getattr(engine, name)
        for model, name in ENGINE_ON_MODEL.items()
        if name in engine.model_fields_set
    }
    if "engine_priority" in given:
        given["engine_priority"] = engine.scheduling == "priority"
    return given


def _moved(index: int, key: str, value: object, to: str) -> SettingNote | None:
    """The note for ``key`` of the model entry at ``index``, if it is an engine's setting:
    move it ``to`` (a template of where, ``{setting}`` as the engine's entry writes it)."""
    if key not in ENGINE_ON_MODEL:
        return None
    where = to.format(setting=_as_on_engine(key, value))
    return SettingNote(("models", index, key), f"an engine setting: move it to {where}")


def _on_engine(key: str, value: object) -> tuple[str, object]:
    """The old-form model setting ``key: value`` as an entry of ``engines`` names it."""
    if key == "engine_priority":
        value = "priority" if value is True else "fcfs"
    return ENGINE_ON_MODEL[key], value


def _as_on_engine(key: str, value: object) -> str:
    """``key: value`` as an entry of ``engines`` writes it."""
    name, value = _on_engine(key, value)
    shown = value if isinstance(value, str) else json.dumps(value, default=str)
    return f"{name}: {shown}"


def split_entry(entry: Mapping[str, Any], engine: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An old-form model entry as the two entries of the new form: the model's own
    settings naming ``engine``, and the entry of ``engines`` of that name holding the
    engine's (each named as an engine names it)."""
    own: dict[str, Any] = {"name": entry["name"], "engine": engine}
    engine_entry: dict[str, Any] = {"name": engine}
    for key, value in entry.items():
        if key in ENGINE_ON_MODEL:
            name, on_engine = _on_engine(key, value)
            engine_entry[name] = on_engine
        elif key != "name":
            own[key] = value
    return own, engine_entry
