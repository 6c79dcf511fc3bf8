"""docs/operations.md states settings' defaults in three forms, and each is the code's:

* inline, a setting's name then its value: "`dispatcher_lease_ms`, 3 s" or
  "`worker_drain_timeout_s` (30 s";
* in a table whose second column is "default": "| `http.keep_alive_s` | 120 s | ...";
* in the YAML of "Scale to zero" (the top-level ``k8s`` block) and of "Replicas found
  through DNS" (a ``discovery`` block), which the page says are at their defaults.

A name is a field of fairq's settings (``http.`` and ``batch.`` for the nested ones), of
an engine, model or discovery entry, or of ``deploy/k8s/fairq.yaml``'s ``k8s`` blocks
(``fairq.k8s.spec``). A name that is none of these is not a setting, and is skipped."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from broker.settings import (
    BatchSettings,
    DiscoveryConfig,
    EngineConfig,
    HttpSettings,
    ModelConfig,
    Settings,
)
from fairq.k8s.spec import ClusterSpec, EngineSpec

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"

_CLASSES: tuple[tuple[str, type[BaseModel]], ...] = (
    ("", Settings),
    ("http.", HttpSettings),
    ("batch.", BatchSettings),
    ("", EngineConfig),
    ("", ModelConfig),
    ("", DiscoveryConfig),
    ("", ClusterSpec),
    ("", EngineSpec),
)
# "`name`, 3 s" or "`name` (30 s": the value right after the name, its unit optional
_INLINE = re.compile(
    r"`(?:k8s\.)?([a-z][a-z0-9_.]*)`(?:,\s+|\s+\()([0-9][0-9,]*(?:\.[0-9]+)?)"
    r"(?:\s+(ms|s|KiB|MiB|GiB)\b)?"
)
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _defaults() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for prefix, cls in _CLASSES:
        for name, field in cls.model_fields.items():
            if not field.is_required():
                found.setdefault(prefix + name, field.get_default(call_default_factory=True))
    return found


DEFAULTS = _defaults()


def _in_units_of(name: str, number: float, unit: str | None) -> float:
    """The documented value in the unit the setting's name carries (`_ms`, `_s`, bytes)."""
    if unit == "s" and name.endswith("_ms"):
        return number * 1000
    if unit == "ms" and name.endswith("_s"):
        return number / 1000
    return number * _UNITS.get(unit or "", 1)


def inline_statements(text: str) -> list[tuple[str, float]]:
    """Every "`name`, value" and "`name` (value" whose name is a setting."""
    return [
        (name, _in_units_of(name, float(number.replace(",", "")), unit))
        for name, number, unit in _INLINE.findall(text)
        if name in DEFAULTS
    ]


def table_statements(text: str) -> list[tuple[str, str]]:
    """(name, default cell) of each row of a table whose second column is "default"."""
    rows: list[tuple[str, str]] = []
    in_table = False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|"):
            in_table = False
        elif len(cells) > 1 and cells[1] == "default":
            in_table = True
        elif in_table and (named := re.match(r"`([a-z][a-z0-9_.]*)`", cells[0])):
            rows += [(named.group(1), cells[1])] if named.group(1) in DEFAULTS else []
    return rows


def _cell_value(name: str, cell: str) -> Any:
    if cell.startswith("unset"):
        return None
    if quoted := re.match(r"`([^`]*)`", cell):
        return quoted.group(1)
    value = re.match(r"([0-9][0-9,]*(?:\.[0-9]+)?)\s*([A-Za-z]+)?", cell)
    assert value, f"{name}: no default in the cell {cell!r}"
    return _in_units_of(name, float(value.group(1).replace(",", "")), value.group(2))


def yaml_blocks(text: str) -> list[Any]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def _same(documented: Any, code: Any) -> bool:
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (documented, code)):
        return math.isclose(documented, code)
    return bool((tuple(documented) if isinstance(documented, list) else documented) == code)


def mismatches(statements: list[tuple[str, Any]]) -> list[str]:
    return [
        f"{name}: docs/operations.md says {documented!r}, the code {DEFAULTS[name]!r}"
        for name, documented in statements
        if not _same(documented, DEFAULTS[name])
    ]


def test_the_inline_defaults_are_the_codes() -> None:
    statements = inline_statements(OPERATIONS.read_text())
    assert len(statements) >= 10, "the page's inline defaults were not found: the form changed?"
    assert mismatches(statements) == []


def test_the_defaults_in_tables_are_the_codes() -> None:
    statements = [(n, _cell_value(n, c)) for n, c in table_statements(OPERATIONS.read_text())]
    assert {"http.keep_alive_s", "max_body_bytes", "metrics_host", "metrics_port"} <= {
        name for name, _ in statements
    }
    assert mismatches(statements) == []


def test_the_k8s_and_discovery_blocks_shown_are_at_their_defaults() -> None:
    blocks = yaml_blocks(OPERATIONS.read_text())
    cluster = [b["k8s"] for b in blocks if isinstance(b, dict) and isinstance(b.get("k8s"), dict)]
    discovery = [
        engine["discovery"]
        for b in blocks
        if isinstance(b, dict)
        for engine in b.get("engines") or []
        if isinstance(engine.get("discovery"), dict)
    ]
    assert cluster and discovery, "the Scale to zero and DNS examples were not found"
    statements = [
        (name, value) for block in cluster + discovery for name, value in block.items()
        if name in DEFAULTS
    ]  # fmt: skip
    assert mismatches(statements) == []


def test_a_default_the_page_misstates_is_found() -> None:
    wrong = "the lease (`lease_ms`, 20 s) and the drain (`worker_drain_timeout_s` (30 s)"
    assert mismatches(inline_statements(wrong)) == [
        "lease_ms: docs/operations.md says 20000.0, the code 15000"
    ]
    table = "| setting | default | past it |\n|---|---|---|\n| `http.body_timeout_s` | 5 s | x |"
    found = [(n, _cell_value(n, c)) for n, c in table_statements(table)]
    assert mismatches(found) == ["http.body_timeout_s: docs/operations.md says 5.0, the code 30.0"]
