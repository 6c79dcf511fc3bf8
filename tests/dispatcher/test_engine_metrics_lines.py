"""Reading only the lines admission needs from an engine's ``/metrics`` page
(``dispatcher.engine_metrics.wanted_lines``), on the real vLLM 0.32 captures."""

from __future__ import annotations

import pytest

from dispatcher import engine_metrics
from dispatcher.engine_metrics import MetricsError, parse_metrics, wanted_lines
from tests.support.paths import FIXTURES

PAGES = {
    name: (FIXTURES / "vllm-0.32-cpu" / f"metrics_{name}.txt").read_text()
    for name in ("idle", "load", "load_big")
}


@pytest.mark.parametrize("name", sorted(PAGES))
@pytest.mark.parametrize("model", [None, "tiny"])
def test_the_wanted_lines_give_the_sample_the_whole_page_gives(
    name: str, model: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = PAGES[name]
    filtered = parse_metrics(text, model)
    monkeypatch.setattr(engine_metrics, "wanted_lines", lambda page: page)  # the whole page
    assert parse_metrics(text, model) == filtered


@pytest.mark.parametrize("name", sorted(PAGES))
def test_nearly_all_of_a_vllm_page_is_skipped(name: str) -> None:
    kept = wanted_lines(PAGES[name]).splitlines()
    assert 5 <= len(kept) <= 12 < len(PAGES[name].splitlines()) / 20
    assert not any(line.startswith("#") or "_bucket" in line for line in kept)


def test_a_look_alike_name_is_not_a_wanted_line() -> None:
    page = 'vllm:num_requests_waiting_by_reason{reason="x"} 5\nvllm:num_requests_waiting 2\n'
    assert wanted_lines(page) == "vllm:num_requests_waiting 2\n"


@pytest.mark.parametrize(
    "line",
    ["$ curl http://engine:8000/metrics", "vllm:num_requests_waiting eight", "<p>hi</p>"],
)
def test_a_page_with_a_line_that_is_not_exposition_is_refused(line: str) -> None:
    with pytest.raises(MetricsError, match="not Prometheus"):
        wanted_lines(PAGES["load"] + line + "\n")
