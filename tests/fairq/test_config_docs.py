"""fairq.example.yaml and README.md's settings table are generated from the settings' own
descriptions (fairq.config_docs): the committed ones are what the settings render now,
every setting has a description and a concern, and the example loads, each setting at
its default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from broker.settings import (
    CONCERNS,
    ApiKeyConfig,
    BatchSettings,
    DiscoveryConfig,
    EngineConfig,
    HttpSettings,
    ModelConfig,
    QuotaConfig,
    Settings,
)
from fairq.config_check import check_file
from fairq.config_docs import example_yaml, fields, settings_table, with_table
from tests.support.cli import fairq

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "fairq.example.yaml"
README = ROOT / "README.md"
CLASSES = (Settings, EngineConfig, DiscoveryConfig, ModelConfig, ApiKeyConfig, HttpSettings,
           BatchSettings, QuotaConfig)  # fmt: skip


def test_the_committed_example_is_what_the_settings_render() -> None:
    assert EXAMPLE.read_text() == example_yaml(), (
        "fairq.example.yaml is stale: `make docs` (fairq config example --write "
        "fairq.example.yaml) regenerates it from the settings' descriptions"
    )


def test_the_readmes_settings_table_is_what_the_settings_render() -> None:
    text = README.read_text()
    assert text == with_table(text, settings_table()), (
        "README.md's settings table is stale: `make docs` (fairq config settings --write "
        "README.md) regenerates it from the settings' descriptions"
    )


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_every_setting_has_a_description(cls: type[BaseModel]) -> None:
    blank = [name for name, field in cls.model_fields.items() if not (field.description or "")]
    assert not blank, f"{cls.__name__}: give {blank} a Field(description=...)"


def test_every_top_level_setting_has_one_concern() -> None:
    listed = [name for names in CONCERNS.values() for name in names]
    assert sorted(listed) == sorted(Settings.model_fields)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_the_example_shows_every_setting_a_file_writes(cls: type[BaseModel]) -> None:
    shown = set(re.findall(r"^ *(?:# )?(?:- )?(\w+):", EXAMPLE.read_text(), re.MULTILINE))
    assert not set(fields(cls)) - shown


def test_the_example_loads_without_a_problem_or_a_note_at_the_defaults(tmp_path: Path) -> None:
    settings, problems = check_file(EXAMPLE)
    assert problems == [] and settings is not None and settings.notes == ()
    (tmp_path / "empty.yaml").write_text("")
    defaults, _ = check_file(tmp_path / "empty.yaml")
    assert defaults is not None
    examples = {"engines", "models", "api_keys"}
    assert settings.model_dump(exclude=examples) == defaults.model_dump(exclude=examples)
    (model,) = settings.models
    assert model == ModelConfig(name="my-model", endpoints=("http://127.0.0.1:8100",))


def test_a_model_of_the_example_is_its_name_and_its_engine() -> None:
    assert yaml.safe_load(EXAMPLE.read_text())["models"] == [
        {"name": "my-model", "engine": "gpu-a"}
    ]


def test_the_table_goes_only_between_its_markers() -> None:
    with pytest.raises(ValueError, match="no settings table markers"):
        with_table("# a README without them\n", settings_table())


def test_fairq_config_prints_the_example_and_the_table() -> None:
    assert fairq("config", "example").stdout == example_yaml()
    assert fairq("config", "settings").stdout == settings_table()
