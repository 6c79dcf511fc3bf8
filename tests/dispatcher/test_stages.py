"""The round's stages, chosen once from a model's settings (``dispatcher.stages``): each
setting picks a stage's form, and neither the round nor the service reads a setting."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from broker import ModelConfig
from dispatcher.newcomer_step import KeepStepClear, NewcomerSteps, NoStepHold
from dispatcher.pacing import PacedRefills, Pacer, UnpacedRefills
from dispatcher.preemption import NoTakeBack, Preemption
from dispatcher.stages import ORDER, Shared, Stages, build

ROOT = Path(__file__).resolve().parents[2]
BANDS = ("interactive", "default", "batch")
SHARED = Shared(NewcomerSteps(), Pacer(), Preemption(None, {}, {}))  # type: ignore[arg-type]


def stages(**settings: Any) -> Stages:
    return build(ModelConfig(name="m", endpoints=("http://a",), **settings), BANDS, SHARED)


def test_the_defaults_turn_every_mechanism_on() -> None:
    on = stages()
    assert isinstance(on.step, KeepStepClear) and isinstance(on.pace, PacedRefills)
    assert on.take_back is SHARED.preemption and on.route.name == "least_loaded"
    assert on.scraped and on.users_in_engine and not on.engine_priority
    assert on.config.batch_slots is None and on.config.refill_ahead == 1  # learned


@pytest.mark.parametrize(
    ("settings", "stage", "off"),
    [
        ({"clear_newcomer_step": False}, "step", NoStepHold),
        ({"pace_refills": False}, "pace", UnpacedRefills),
        ({"preemption": False}, "take_back", NoTakeBack),
        # Without the batch rule nothing tells newcomers from users in the engine.
        ({"batch_slots": 0}, "step", NoStepHold),
        ({"batch_slots": 0}, "pace", UnpacedRefills),
        ({"admission": "static"}, "step", NoStepHold),
    ],
    ids=str,
)
def test_each_setting_chooses_its_stages_form(
    settings: dict[str, Any], stage: str, off: type
) -> None:
    assert isinstance(getattr(stages(**settings), stage), off)


def test_prefix_routing_keeps_its_load_bound_and_sends_nothing_express_across_replicas() -> None:
    route = stages(routing="prefix", routing_load_bound=1.5).route
    assert (route.name, route.load_bound) == ("prefix", 1.5)
    assert route.express(1) and not route.express(2)
    assert stages().route.express(2)


def test_without_preemption_no_job_waits_beyond_the_batch() -> None:
    assert stages(preemption=False).config.refill_ahead == 0


# Every setting that chooses a mechanism: only dispatcher/stages.py (and the policies'
# own configuration, AdmissionConfig.of) may read them.
MECHANISM_SETTINGS = {
    "admission", "admission_policy", "batch_slots", "reserved_slots", "queue_targets",
    "preemption", "clear_newcomer_step", "pace_refills", "engine_priority", "resume_streams",
    "routing", "routing_load_bound", "policy", "stream_from_engine",
}  # fmt: skip


@pytest.mark.parametrize("module", ["dispatcher/round.py", "dispatcher/service.py"])
def test_the_round_and_the_service_read_no_mechanisms_setting(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    read = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute | ast.Name)
        and _names_a_model(node.value)
    }
    assert not read & MECHANISM_SETTINGS, sorted(read & MECHANISM_SETTINGS)


def _names_a_model(node: ast.expr) -> bool:
    """``model.x``, ``m.x``, ``self.model.x``, ``other.x``: a ModelConfig's attribute."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name in {"model", "m", "other", "config_model"}


def test_the_order_of_the_stages_is_written_in_the_architecture_page() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = [line.split("|")[2].strip() for line in page.splitlines() if line.startswith("| ")]
    written = [row for row in rows if row in ORDER]
    assert written == list(ORDER)
