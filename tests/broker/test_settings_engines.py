"""An engine described once, named by its models (broker.settings.resolve): a model entry
of two lines gets its engine's settings; the old form, a model carrying them itself, loads
as before with a note per setting to move; what cannot be resolved, or contradicts itself,
is refused at the path of the setting to change."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from broker import EngineConfig, ModelConfig, Settings, engine_groups
from broker.errors import SettingError
from broker.settings import split_entry

ENGINE = "http://10.0.0.1:8000"
GPU_A = {"name": "gpu-a", "endpoints": [ENGINE]}


def refusal(**fields: Any) -> tuple[tuple[str | int, ...], str]:
    """The first error's full path (pydantic's place, then a SettingError's own) and message."""
    with pytest.raises(ValidationError) as caught:
        Settings(**fields)
    error = caught.value.errors()[0]
    cause = (error.get("ctx") or {}).get("error")
    path = tuple(error["loc"]) + (cause.path if isinstance(cause, SettingError) else ())
    return path, str(error["msg"]).removeprefix("Value error, ")


def test_a_model_of_two_lines_gets_its_engines_settings() -> None:
    engine = {**GPU_A, "kind": "vllm", "scheduling": "priority", "batch_slots": 8}
    loaded = Settings(engines=[engine], models=[{"name": "m", "engine": "gpu-a"}])
    (model,) = loaded.models
    assert (model.engine, model.endpoints, model.batch_slots) == ("vllm", (ENGINE,), 8)
    assert model.engine_priority and model.admission_policy == "metrics"
    assert loaded.notes == ()


def test_models_naming_one_engine_are_one_engine_with_their_own_settings() -> None:
    loaded = Settings(
        engines=[GPU_A],
        models=[
            {"name": "base", "engine": "gpu-a"},
            {"name": "base-sql", "engine": "gpu-a", "policy": "token_fair"},
        ],
    )
    ((base, sql),) = engine_groups(loaded.models)
    assert (base.policy, sql.policy) == ("round_robin", "token_fair")


def test_the_old_form_loads_as_before_with_a_note_per_engine_setting() -> None:
    entry = {"name": "m", "engine": "sglang", "endpoints": [ENGINE], "engine_priority": False}
    loaded = Settings(models=[{**entry, "batch_slots": 4, "policy": "token_fair"}])
    assert loaded.models[0].engine == "sglang" and loaded.models[0].batch_slots == 4
    notes = {note.path: note.message for note in loaded.notes}
    moved = ("engine", "endpoints", "engine_priority", "batch_slots")
    assert set(notes) == {("models", 0, key) for key in moved}
    assert notes[("models", 0, "engine")] == (
        "an engine setting: move it to an entry of engines (kind: sglang) and give the model "
        "engine: <that entry's name>"
    )
    assert "(scheduling: fcfs)" in notes[("models", 0, "engine_priority")]


def test_an_engine_setting_on_a_model_naming_its_engine_wins_with_a_note() -> None:
    loaded = Settings(engines=[GPU_A], models=[{"name": "m", "engine": "gpu-a", "inflight_cap": 2}])
    assert loaded.models[0].inflight_cap == 2
    (note,) = loaded.notes
    assert note.path == ("models", 0, "inflight_cap")
    assert note.message == "an engine setting: move it to engines[0] (gpu-a) as inflight_cap: 2"


def test_two_names_of_one_engine_that_differ_on_its_setting_are_refused_at_the_second() -> None:
    models = [{"name": "a", "engine": "gpu-a"}, {"name": "b", "engine": "gpu-a", "batch_slots": 4}]
    path, message = refusal(engines=[GPU_A], models=models)
    assert path == ("models", 1, "batch_slots")
    assert "'a' and 'b' share an engine, so they must agree on batch_slots" in message


def test_an_unknown_engine_is_refused_naming_the_known_ones_with_the_other_problems() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(engines=[GPU_A], models=[{"name": "m", "engine": "gpu-b"}], result_ttl_s="soon")
    errors = caught.value.errors()
    assert [e["loc"] for e in errors] == [("result_ttl_s",), ()]  # nothing more of model m
    cause = errors[1]["ctx"]["error"]
    assert cause.path == ("models", 0, "engine")
    assert str(cause).startswith("'gpu-b' is neither the name of an entry of engines (gpu-a)")


def test_an_invalid_engine_is_told_once_not_again_at_each_of_its_models() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(
            engines=[{**GPU_A, "batch_slots": -1}],
            models=[{"name": "a", "engine": "gpu-a"}, {"name": "b", "engine": "gpu-a"}],
        )
    assert [e["loc"] for e in caught.value.errors()] == [("engines", 0, "batch_slots")]


@pytest.mark.parametrize("key", ["endpoints", "discovery"])
def test_a_model_naming_an_engine_does_not_say_where_it_is(key: str) -> None:
    place = {"endpoints": [ENGINE], "discovery": {"dns": "engine.local", "port": 8000}}[key]
    path, message = refusal(engines=[GPU_A], models=[{"name": "m", "engine": "gpu-a", key: place}])
    assert path == ("models", 0, key)
    assert f"remove {key} here, or move it to engines[0]" in message


@pytest.mark.parametrize(
    ("engine", "path", "says"),
    [
        ({"name": "vllm"}, ("engines", 0, "name"), "is a kind of engine"),
        ({"kind": "sglang", "scheduling": "priority"}, ("engines", 0, "scheduling"), "vLLM's"),
        ({"batch_slots": 0, "clear_newcomer_step": True}, ("engines", 0, "clear_newcomer_step"),
         "batch_slots: 0 turns the batch rule off"),
        ({"admission": "static", "pace_refills": True}, ("engines", 0, "pace_refills"),
         "admission: static reads no metrics"),
        ({"endpoints": []}, ("engines", 0), "needs endpoints"),
    ],
)  # fmt: skip
def test_an_engine_that_contradicts_itself_is_refused_at_the_setting(
    engine: dict[str, Any], path: tuple[str | int, ...], says: str
) -> None:
    found, message = refusal(engines=[{**GPU_A, **engine}])
    assert found == path and says in message


def test_a_mechanism_switched_off_by_its_defaults_is_no_contradiction() -> None:
    quiet = {**GPU_A, "batch_slots": 0, "admission": "static"}
    assert Settings(engines=[quiet]).engines[0].clear_newcomer_step
    assert EngineConfig(name="e", endpoints=(ENGINE,), kind="openai", pace_refills=True)


def test_two_entries_of_one_engine_are_refused() -> None:
    path, message = refusal(engines=[GPU_A, {**GPU_A, "name": "gpu-b"}])
    assert path == ("engines", 1, "endpoints")
    assert "describe it in one entry" in message


def test_engine_and_model_names_are_unique() -> None:
    assert refusal(engines=[GPU_A, {"name": "gpu-a", "endpoints": ["http://b:1"]}])[0] == (
        "engines", 1, "name",
    )  # fmt: skip
    twice = [{"name": "m", "engine": "gpu-a"}] * 2
    assert refusal(engines=[GPU_A], models=twice)[0] == ("models", 1, "name")


def test_models_given_as_objects_load_as_they_are_without_notes() -> None:
    model = ModelConfig(name="m", endpoints=(ENGINE,), batch_slots=4)
    assert Settings(models=(model,)).notes == ()


def test_engines_and_models_load_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRQ_ENGINES", '[{"name": "gpu-a", "endpoints": ["http://e:8000"]}]')
    monkeypatch.setenv("FAIRQ_MODELS", '[{"name": "m", "engine": "gpu-a"}]')
    assert Settings().models[0].endpoints == ("http://e:8000",)


def test_an_old_form_entry_split_in_two_loads_as_the_same_model_without_notes() -> None:
    old = {"name": "m", "engine": "vllm", "engine_priority": True, "endpoints": [ENGINE],
           "batch_slots": 8, "policy": "token_fair"}  # fmt: skip
    own, engine = split_entry(old, "gpu-a")
    assert own == {"name": "m", "engine": "gpu-a", "policy": "token_fair"}
    assert engine == {"name": "gpu-a", "kind": "vllm", "scheduling": "priority",
                      "endpoints": [ENGINE], "batch_slots": 8}  # fmt: skip
    split = Settings(engines=[engine], models=[own])
    assert split.notes == () and split.models == Settings(models=[old]).models
