"""Models that name one engine share it (broker.engines): grouped by endpoint URL or DNS
name, and refused with a readable error when they name it differently or disagree on
what one engine has one of."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from broker import ModelConfig, engine_groups
from tests.support.settings import make_settings

ENGINE = "http://10.0.0.1:8000"
OTHER = "http://10.0.0.2:8000"


def model(name: str, endpoints: tuple[str, ...] = (ENGINE,), **fields: Any) -> ModelConfig:
    return ModelConfig(name=name, endpoints=endpoints, **fields)


def names(groups: tuple[tuple[ModelConfig, ...], ...]) -> list[list[str]]:
    return [[m.name for m in group] for group in groups]


def test_models_listing_the_same_endpoint_share_its_engine_in_configuration_order() -> None:
    models = (
        model("base"),
        model("solo", (OTHER,)),
        model("base-lora-a", (ENGINE + "/",)),  # a trailing slash is the same URL
        model("base-lora-b"),
    )
    assert names(engine_groups(models)) == [["base", "base-lora-a", "base-lora-b"], ["solo"]]


def test_models_following_the_same_dns_name_share_its_engine() -> None:
    found = {"dns": "engine-llama.fairq.svc.cluster.local", "port": 8000}
    same = {"dns": "Engine-Llama.fairq.svc.cluster.local.", "port": 8000}
    models = (
        model("a", (), discovery=found),
        model("b", (), discovery=same),  # DNS names are case-blind; the root dot is the same
        model("c", (), discovery={**found, "port": 8001}),  # another port: another engine
    )
    assert names(engine_groups(models)) == [["a", "b"], ["c"]]


def test_a_model_that_lists_only_part_of_a_shared_engine_is_refused_with_both_names() -> None:
    with pytest.raises(ValueError, match=r"'a' and 'b' share an engine .* same endpoints"):
        engine_groups((model("a", (ENGINE, OTHER)), model("b", (ENGINE,))))


def test_a_chain_of_overlaps_is_one_engine_and_refused_unless_named_alike() -> None:
    third = "http://10.0.0.3:8000"
    chain = (model("a", (ENGINE,)), model("c", (OTHER, third)), model("b", (ENGINE, OTHER)))
    with pytest.raises(ValueError, match="share an engine"):
        engine_groups(chain)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("engine", "sglang"),
        ("batch_slots", 4),
        ("inflight_cap", 3),
        ("engine_priority", True),
        ("routing", "prefix"),
        ("admission", "static"),
    ],
)
def test_models_sharing_an_engine_must_agree_on_its_settings(setting: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"must agree on {setting}"):
        engine_groups((model("a"), model("b", **{setting: value})))


def test_per_model_settings_may_differ_on_one_engine() -> None:
    models = (
        model("a", policy="token_fair", output_token_cost=4.0, resume_streams="off"),
        model("b", policy="round_robin", default_output_tokens=32),
    )
    assert names(engine_groups(models)) == [["a", "b"]]


def test_settings_refuse_two_queue_targets_for_one_engine() -> None:
    entries: list[dict[str, Any]] = [
        {"name": "a", "endpoints": [ENGINE], "queue_targets": {"interactive": 2}},
        {"name": "b", "endpoints": [ENGINE]},
    ]
    with pytest.raises(ValidationError, match=r"agree on queue_targets\['interactive'\]"):
        make_settings(models=entries)
    entries[1]["queue_targets"] = {"interactive": 2}
    assert [m.name for m in make_settings(models=entries).models] == ["a", "b"]
