"""``fairq bench fairness``: the real harness on a small scenario, and its pure parts.

The integration tests run arms (a) and (c) with real processes (simulator, Redis,
dispatcher, workers, gateway) on the small default profile, and check that the
outputs are written and the figures are sane; they assert nothing about speed:
the figures depend on the machine. The unit tests pin the pure parts on
hand-made values: engine steps, heavy users' shares, failure marking, context
sizing, arm availability by engine policy, the stream reader, the plans.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from benchmarks.fairness.arms import (
    ARMS,
    arm_title,
    config_problem,
    parse_arms,
    policy_problem,
)
from benchmarks.fairness.checks import criteria, verdict
from benchmarks.fairness.cli import failed_arms
from benchmarks.fairness.report import arm_summary, compare, render
from benchmarks.fairness.resumed import Answer, problems, whole
from benchmarks.fairness.scenarios import (
    PRESETS,
    Scenario,
    build,
    context_problem,
    family_for,
    parse_names,
    plan,
)
from benchmarks.fairness.shares import backlog_window, shares
from benchmarks.fairness.stages import stages_of
from benchmarks.lib.cpu import ProcessGroups, cpu_split
from benchmarks.lib.engine_watch import Sample, engine_work, parse_sample, preemptions, step_ms
from benchmarks.lib.load import LoadResult, Planned, RequestResult, Target, run_load
from benchmarks.lib.provision import REPORTED, STARTED, STATED, UNKNOWN, KnownPolicy
from benchmarks.lib.sse import StreamTally
from fairq.cli import main
from tests.support.paths import FIXTURES
from tests.support.servers import uvicorn_thread

# Light answers of 10 tokens, not the preset's 50: each arm's idle TTFT is measured on
# light requests first, and those, one at a time, took half of the run.
LIGHT_TOKENS = 10
SMALL = [
    "--power-requests", "30", "--prompt-tokens", "20", "--output-tokens", "20",
    "--light-users", "2", "--light-start-s", "0.1", "--light-interval-s", "0.2",
    "--light-output-tokens", str(LIGHT_TOKENS), "--arms", "a,c", "--profile", "default",
]  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_small_run_writes_table_json_and_plots_with_every_request_measured(
    tmp_path: Path,
) -> None:
    args = ["bench", "fairness", *SMALL, "--scenario", "seed,mixed", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output

    figures = json.loads(result.stdout)
    assert figures == json.loads((tmp_path / "fairness.json").read_text())
    for name in ("seed", "mixed"):
        assert (tmp_path / f"fairness-{name}.png").read_bytes().startswith(b"\x89PNG")
    markdown = (tmp_path / "fairness.md").read_text()
    assert "| (c) fairq defaults [engine fcfs, as started] |" in markdown
    assert "estimates" in markdown
    assert figures["failed_arms"] == [] and figures["machine"]["cores"]
    seed = figures["scenarios"]["seed"]
    assert seed["idle_ttft_ms"] > 0 and set(seed["criteria"]) == {
        "c_light_p95_steps", "c_tok_s_vs_a", "all_hold",
    }  # fmt: skip
    for key in ("a", "c"):
        arm = seed["arms"][key]
        assert arm["status"] == "ok", arm
        assert arm["errors"] == [] and arm["heavy_ok"] == 30
        assert [r["user"] for r in arm["light"]] == ["B", "C"]
        assert all(r["ttft_ms"] > 0 and r["error"] is None for r in arm["light"])
        assert all(r["output_tokens"] == LIGHT_TOKENS for r in arm["light"])
        assert arm["output_tokens"] == 30 * 20 + 2 * LIGHT_TOKENS
        assert arm["output_tok_s"] > 0 and arm["power_done_s"] > 0
        assert arm["engine"]["trace"]["t_s"] and arm["engine"]["scrape_failures"] == 0
        assert arm["cpu"]["client_s"] > 0
    assert seed["arms"]["c"]["cpu"]["fairq_s"] > 0
    mixed = figures["scenarios"]["mixed"]["arms"]["c"]
    assert mixed["status"] == "ok" and mixed["heavy_ok"] == 3 * 30
    assert set(mixed["shares"]["users"]) == {"A", "B", "C"}


def test_a_scenario_that_does_not_fit_the_engine_is_refused_before_any_arm(
    tmp_path: Path,
) -> None:
    args = ["--scenario", "long", "--profile", "default", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, ["bench", "fairness", *args])
    assert result.exit_code == 2
    assert "max_model_len 4096" in result.output and not (tmp_path / "fairness.json").exists()


def test_unknown_arms_and_scenarios_are_usage_errors() -> None:
    result = CliRunner().invoke(main, ["bench", "fairness", "--arms", "a,z"])
    assert result.exit_code == 2 and "unknown arm" in result.output
    result = CliRunner().invoke(main, ["bench", "fairness", "--scenario", "seed,huge"])
    assert result.exit_code == 2 and "unknown scenario" in result.output


def test_arms_and_scenarios_keep_the_order_given_and_drop_repeats() -> None:
    assert [a.key for a in parse_arms("c, a,c")] == ["c", "a"]
    assert parse_names(["long", "seed,long", "mixed"]) == ["long", "seed", "mixed"]


def test_fairq_model_settings_of_every_arm_are_checked_against_the_installed_fairq() -> None:
    for arm in ARMS.values():
        problem = config_problem(arm, "m", "http://127.0.0.1:1")
        assert problem is None or "fairq rejects" in problem or "no fairness policy" in problem


# --- scenarios and context ---------------------------------------------------------------


def test_the_seed_light_users_come_two_at_once_then_one_per_interval() -> None:
    scenario = Scenario("seed", 1, 10, (5, 5), False, light_users=4, light_interval_s=5.0)
    assert scenario.light_schedule() == [("B", 1.0), ("C", 1.0), ("D", 6.0), ("E", 11.0)]


def test_long_answers_are_seeded_and_within_their_range() -> None:
    scenario = build("long", "h100", {"power_requests": 50})
    lengths = [p.max_tokens for p in plan(scenario) if p.heavy]
    assert len(lengths) == 50 and all(1500 <= n <= 4000 for n in lengths)
    assert len(set(lengths)) > 10 and lengths == [p.max_tokens for p in plan(scenario) if p.heavy]
    assert all(p.stream for p in plan(scenario))


def test_mixed_interleaves_heavy_users_and_sends_light_ones_at_seeded_poisson_times() -> None:
    scenario = build("mixed", "h100", {"power_requests": 2, "light_users": 2, "light_requests": 3})
    requests = plan(scenario)
    assert [p.user for p in requests if p.heavy] == ["A", "B", "C", "A", "B", "C"]
    assert scenario.heavy_users() == {"A": 1.0, "B": 2.0, "C": 4.0}
    light = scenario.light_schedule()
    assert [u for u, _ in light] == ["D", "E", "D", "E", "D", "E"]
    times = [t for _, t in light]
    assert times == sorted(times) and times[0] == scenario.light_start_s
    assert light == build("mixed", "h100", {"light_users": 2, "light_requests": 3}).light_schedule()


def test_flags_apply_only_to_the_scenarios_they_name() -> None:
    flags = {"output_tokens": 64, "long_output_tokens": (100, 200), "heavy_weights": (1.0, 3.0)}
    assert build("seed", "h100", flags).output_tokens == (64, 64)
    assert build("long", "h100", flags).output_tokens == (100, 200)
    assert build("long", "h100", flags).heavy_weights == (1.0,)
    assert build("mixed", "h100", flags).heavy_weights == (1.0, 3.0)
    with pytest.raises(ValueError, match="must be >= 1"):
        build("seed", "h100", {"power_requests": 0})


def test_every_tiny_preset_fits_a_512_token_context_and_the_h100_ones_do_not() -> None:
    for name, scenario in PRESETS["tiny"].items():
        assert context_problem(scenario, 512) is None, name
    problem = context_problem(PRESETS["h100"]["seed"], 512)
    assert problem is not None and "1466 tokens" in problem and "max_model_len 512" in problem
    assert family_for(["seed", "long"], 512) == "tiny"
    assert family_for(["seed", "long", "mixed"], 131072) == "h100"


def test_the_context_check_counts_prompt_slack_output_and_template_margin() -> None:
    scenario = Scenario("long", 1, 32, (400, 456), True, light_output_tokens=32)
    assert context_problem(scenario, 512) is None  # 40 + 456 + 16 = 512
    assert context_problem(scenario, 511) is not None


# --- engine steps and the engine's figures ------------------------------------------------


def _sample(t_s: float, itl_sum_s: float, itl_count: float, pre: float | None = None) -> Sample:
    return Sample(t_s, 0.0, 0.0, 0.0, itl_sum_s, itl_count, pre)


def test_an_engine_step_is_the_histograms_delta_sum_over_delta_count_inside_the_window() -> None:
    samples = [
        _sample(-0.5, 1.0, 100),  # before t=0: left out
        _sample(0.1, 2.0, 200),
        _sample(2.0, 5.0, 300),
        _sample(4.0, 8.0, 400),
        _sample(9.0, 100.0, 500),  # after the flood: left out
    ]
    assert step_ms(samples, 0.0, 5.0) == pytest.approx(30.0)  # 6 s over 200 tokens
    assert step_ms(samples, 0.0, 1.0) is None  # one scrape
    assert step_ms([_sample(0.1, 2.0, 200), _sample(1.0, 2.0, 200)], 0.0, 5.0) is None


def test_preemptions_are_the_counters_delta_or_none_when_not_exported() -> None:
    assert preemptions([_sample(0, 0, 0, 3.0), _sample(1, 0, 0, 3.0), _sample(2, 0, 0, 7.0)]) == 4
    assert preemptions([_sample(0, 0, 0), _sample(1, 0, 0)]) is None


def test_a_real_vllm_scrape_gives_its_histogram_and_preemption_counter() -> None:
    text = (FIXTURES / "vllm-0.32-cpu" / "metrics_load.txt").read_text()
    sample = parse_sample(text, "tiny", 1.0)
    assert sample.preemptions == 0.0 and sample.itl_count > 0 and sample.itl_sum_s > 0
    # Its step histogram: 38 steps computed 811 tokens, its 111 output and 700 prompt tokens
    assert (sample.steps, sample.step_tokens, sample.generated) == (38.0, 811.0, 111.0)


def test_engine_work_is_the_steps_and_the_prompt_tokens_between_first_and_last_scrape() -> None:
    def at(t_s: float, steps: float | None, tokens: float | None, generated: float) -> Sample:
        return Sample(t_s, 0.0, 0.0, generated, 0.0, 0.0, steps=steps, step_tokens=tokens)

    samples = [at(0, 10, 1000, 100), at(1, None, None, 150), at(2, 60, 4000, 300)]
    # 50 steps computed 3,000 tokens, 200 of them output: 2,800 prompt tokens prefilled
    assert engine_work(samples) == {
        "steps": 50,
        "prefill_tokens": 2800,
        "sim_modeled_s": None,
        "sim_overrun_s": None,
    }
    sim = [replace(samples[0], sim_modeled_s=1.0, sim_overrun_s=0.1),
           replace(samples[2], sim_modeled_s=5.0, sim_overrun_s=0.3)]  # fmt: skip
    work = engine_work(sim)
    assert work is not None and work["sim_modeled_s"] == 4.0
    assert work["sim_overrun_s"] == pytest.approx(0.2)
    assert engine_work([at(0, None, None, 0), at(1, None, None, 5)]) is None  # not exported


# --- shares --------------------------------------------------------------------------------


def _streamed(user: str, first: float | None, tokens: int, buckets: dict[int, int]) -> Any:
    result = RequestResult(user, True, 0.0, tokens, first_token_s=first, output_tokens=tokens)
    result.buckets = buckets
    return result


def test_the_backlog_window_runs_from_the_last_first_token_to_the_first_backlog_end() -> None:
    requests = [
        _streamed("A", 0.2, 10, {}),
        _streamed("A", 3.0, 10, {}),  # A's last request starts at 3.0: A's backlog ends
        _streamed("B", 0.5, 10, {}),
        _streamed("B", 6.0, 10, {}),
    ]
    assert backlog_window(requests, ["A", "B"]) == (0.5, 3.0)
    assert backlog_window([*requests, _streamed("B", None, 10, {})], ["A", "B"]) is None


def test_shares_count_the_tokens_inside_the_window_scaled_to_usage() -> None:
    # Buckets of 1 s: A's events at 0-1 s and 5-6 s, B's spread over 0-4 s.
    requests = [
        _streamed("A", 0.0, 40, {0: 10, 5: 10}),  # 20 events for 40 tokens: 2 per event
        _streamed("A", 2.0, 20, {2: 20}),
        _streamed("B", 0.0, 60, {0: 15, 1: 15, 2: 15, 3: 15}),
        _streamed("B", 4.0, 10, {4: 10}),
    ]
    result = shares(requests, {"A": 1.0, "B": 3.0}, bucket_s=1.0)
    assert result["window_s"] == [0.0, 2.0]  # buckets 0 and 1 have their middle inside
    a, b = result["users"]["A"], result["users"]["B"]
    assert a["tokens"] == 20.0 and b["tokens"] == 30.0
    assert a["share"] == pytest.approx(0.4) and a["weight_share"] == 0.25
    assert a["off"] == pytest.approx(0.6) and b["off"] == pytest.approx(0.2)
    assert result["max_off"] == pytest.approx(0.6)


# --- failures and the Done-when ---------------------------------------------------------


def _load(errors: list[str | None]) -> LoadResult:
    requests = [RequestResult("A", True, 0.0, 10, end_s=1.0, output_tokens=10)]
    for i, error in enumerate(errors):
        light = RequestResult("B", False, 0.5, 10, ttft_s=0.01 * (i + 1), end_s=1.0)
        light.output_tokens, light.error = (0, error) if error else (10, None)
        requests.append(light)
    return LoadResult(requests, wall_s=2.0)


_ENGINE = {"step_ms": 5.0, "preemptions": 0.0, "peak_waiting": 3.0}
_CPU = {"fairq_s": 1.0, "engine_s": 2.0, "client_s": 0.5}


def _arm(errors: list[str | None], title: str = "t") -> dict[str, Any]:
    return {"title": title, **arm_summary(_load(errors), 0.01, _ENGINE, _CPU)}


def test_light_ttft_is_given_in_engine_steps() -> None:
    arm = _arm([None, None])
    assert arm["status"] == "ok" and arm["light_ttft_ms"]["max"] == pytest.approx(20.0)
    assert arm["light_ttft_steps"]["max"] == pytest.approx(4.0)
    assert arm["light_by_user"]["B"]["p95_steps"] == pytest.approx(3.9)


def test_an_arm_with_one_failed_request_is_failed_and_fails_every_check_it_is_in() -> None:
    arms = {"a": _arm([None, "HTTP 400: too long"]), "c": _arm([None, None])}
    compare(arms)
    assert arms["a"]["status"] == "FAILED"
    assert arms["a"]["failed"] == {"count": 1, "of": 3, "first_error": "HTTP 400: too long"}
    checks = criteria("seed", arms)
    assert checks["c_light_p95_steps"]["value"] == pytest.approx(3.9)  # 19.5 ms, 5 ms steps
    assert checks["c_tok_s_vs_a"] == {
        "label": "(c) output tok/s >= 95% of (a)", "value": None, "bound": 0.95,
        "holds": False, "why": "arm (a) FAILED",
    }  # fmt: skip
    assert checks["all_hold"] is False
    result = _result({"seed": {"arms": arms, "criteria": checks}})
    assert failed_arms(result["scenarios"]) == ["seed (a)"]
    text = render(result)
    assert "FAILED: 1 of 3 requests failed; first: HTTP 400: too long" in text
    assert "does not hold: arm (a) FAILED" in text


def test_a_p95_check_says_over_how_few_requests_it_was_read() -> None:
    arms = {"a": _arm([None, None]), "c": _arm([None, None])}
    compare(arms)
    checks = criteria("seed", arms)
    assert checks["c_light_p95_steps"]["samples"] == 2
    few = verdict(checks["c_light_p95_steps"])
    assert few == "MISSED; over 2 requests, between the two largest"
    assert "samples" not in checks["c_tok_s_vs_a"]
    many = {**checks["c_light_p95_steps"], "holds": True, "samples": 21}
    assert verdict(many) == "holds"  # from 21 on a p95 lies below the second largest


def test_the_report_gives_the_floods_send_rate_per_engine_step_and_its_stages() -> None:
    # Sent at 0, 50 and 100 ms: two gaps in 0.1 s, 20 a second; 5 ms steps: 0.1 a step.
    times = [[0, 0, 2, 100], [0, 50, 54, 160], [0, 100, 101, 190]]
    flood = [{"user": "A", "dispatched_ms": t[1], **stages_of(t)} for t in times]
    arm = {"title": "t", **arm_summary(_load([None]), 0.01, _ENGINE, _CPU, flood_stages=flood)}
    arms = {"c": arm}
    text = render(_result({"seed": {"arms": arms, "criteria": criteria("seed", arms)}}))
    # hand-over 2, 4, 1 ms; at the engine 98, 106, 89 ms (19.6 steps at p50)
    assert "| (c) t | 20.0 | 0.10 | 2.0 / 4.0 | 98.0 / 106.0 | 19.6 |" in text


def test_checks_of_arms_not_run_or_not_available_are_not_evaluated() -> None:
    arms = {"c": _arm([None]), "d": {"title": "d", "status": "not available", "reason": "r"}}
    checks = criteria("mixed", arms)
    assert checks["c_light_users_p95_steps"]["holds"] is True
    assert checks["d_heavy_shares_within_10pct"]["holds"] is None
    assert checks["d_heavy_shares_within_10pct"]["why"] == "arm (d) is not available"
    assert criteria("long", arms)["c_tok_s_vs_a"]["why"] == "arm (a) was not run"


def _result(sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    for name, section in sections.items():
        section.setdefault("scenario", vars(PRESETS["h100"][name]))
        section.setdefault("idle_ttft_ms", 8.0)
    return {
        "date": "d", "engine": "e", "simulated": True, "engine_note": "estimates",
        "machine": {"cores": 2, "platform": "p", "python": "3"}, "cpu_pinning": "off",
        "scenarios": sections, "failed_arms": failed_arms(sections),
    }  # fmt: skip


# --- arms and engine policies -------------------------------------------------------------


def test_an_external_engine_serves_only_the_arms_of_the_policy_known() -> None:
    url = "http://e:8000"
    fcfs, priority = KnownPolicy("fcfs", STATED), KnownPolicy("priority", REPORTED)
    assert policy_problem(ARMS["e"], None, KnownPolicy("priority", STARTED)) is None
    assert policy_problem(ARMS["a"], url, UNKNOWN) is None  # sends no priority
    assert policy_problem(ARMS["c"], url, UNKNOWN) is None
    for key in ("e", "f"):  # they send priorities: not against an engine of unknown policy
        assert "say --engine-policy priority" in str(policy_problem(ARMS[key], url, UNKNOWN))
    assert policy_problem(ARMS["e"], url, priority) is None
    assert policy_problem(ARMS["f"], url, fcfs) == f"the engine at {url} runs fcfs ({STATED})"
    assert policy_problem(ARMS["c"], url, priority) == (
        f"the engine at {url} runs priority ({REPORTED})"
    )


def test_arm_titles_name_the_policy_the_engine_ran_and_how_it_is_known() -> None:
    started = KnownPolicy("fcfs", STARTED)
    assert arm_title(ARMS["c"], started) == "fairq defaults [engine fcfs, as started]"
    assert arm_title(ARMS["e"], KnownPolicy("priority", STATED)) == (
        "engine priority (direct) [engine priority, per --engine-policy]"
    )
    assert arm_title(ARMS["a"], KnownPolicy("fcfs", REPORTED)) == (
        "engine FIFO (direct) [engine fcfs, per its /server_info]"
    )
    assert arm_title(ARMS["a"], UNKNOWN) == (
        "engine FIFO (direct) [engine policy unknown, no priorities sent]"
    )
    assert arm_title(ARMS["e"], UNKNOWN, runs=False) == "engine priority (direct)"


def test_the_new_arms_carry_the_new_admission_settings() -> None:
    assert ARMS["g"].model_overrides == {"batch_slots": 0, "reserved_slots": 0}
    assert ARMS["h"].model_overrides == {"reserved_slots": 0}
    assert ARMS["i"].model_overrides == {"resume_streams": "exact"}
    assert ARMS["j"].model_overrides == {"resume_streams": "off"}
    assert ARMS["q"].model_overrides == {"preemption": False}


# --- the stream reader and CPU ------------------------------------------------------------

_ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
_TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
_USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n'


@pytest.mark.parametrize("piece", [1, 7, 50, 10_000])
def test_the_stream_reader_finds_the_first_token_counts_events_and_reads_usage(
    piece: int,
) -> None:
    stream = _ROLE + _TOKEN * 5 + _USAGE + b"data: [DONE]\n\n"
    tally = StreamTally(origin=100.0, bucket_s=1.0)
    for i in range(0, len(stream), piece):
        tally.feed(stream[i : i + piece], now=100.0 + i / len(stream) * 3)
    assert tally.first_token_s is not None and tally.first_token_s < 3
    assert tally.events == 6  # five tokens and the usage event
    assert sum(tally.buckets.values()) == 6
    assert tally.usage_tokens() == 5 and tally.tail_error() is None


def test_the_stream_reader_reports_an_error_event() -> None:
    tally = StreamTally(origin=0.0)
    tally.feed(b'data: {"error":{"message":"engine died"}}\n\ndata: [DONE]\n\n', now=1.0)
    assert tally.first_token_s is None and tally.usage_tokens() is None
    assert "engine died" in str(tally.tail_error())


def test_cpu_is_split_into_engine_fairq_and_client_by_process_group() -> None:
    groups = ProcessGroups(frozenset({1}), frozenset({2, 3}), {2: "api", 3: "worker-0"})
    before = {1: 10.0, 2: 1.0, 3: 2.0}
    after = {1: 14.0, 2: 1.5, 3: 3.0, 4: 9.0}  # 4 is in no group
    split = cpu_split(before, after, groups, client_s=0.25)
    assert split == {
        "engine_s": 4.0, "fairq_s": 1.5, "client_s": 0.25,
        "fairq_by_process": {"api": 0.5, "worker-0": 1.0},
    }  # fmt: skip


# --- answers fairq resumed mid-way: whole, each token once -------------------------------


def _answer(text_tokens: list[str], ids: list[int], usage: int | None = None) -> Answer:
    head = {"id": "x", "created": 1, "choices": [{"delta": {"role": "assistant", "content": ""}}]}
    chunks = [head] + [
        {"id": "x", "created": 1, "choices": [{"delta": {"content": t}}]} for t in text_tokens
    ]
    if usage is not None:
        chunks.append(
            {"id": "x", "created": 1, "choices": [], "usage": {"completion_tokens": usage}}
        )
    return Answer("j", chunks, [1], ids)


def test_a_resumed_answer_is_whole_when_its_text_is_the_text_of_its_ids() -> None:
    from sim._wire import WORDS, word_index

    walk = [WORDS[word_index(5, i, len(WORDS))] for i in range(6)]
    assert problems([_answer(walk, list(range(6)), 6)], "sim", None) == []
    repeated = [*walk[:3], walk[2], *walk[3:5]]  # a token twice, one lost: 6 all the same
    (problem,) = problems([_answer(repeated, list(range(6)), 6)], "sim", None)
    assert problem.startswith("j: its text is not one walk of the simulator's words")

    def decode(answers: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[str]:
        return ["".join(walk)]  # what the engine would have streamed uncut

    assert problems([_answer(walk, list(range(6)))], "vllm", decode) == []
    (problem,) = problems([_answer(repeated, list(range(6)))], "vllm", decode)
    assert problem.startswith("j: its text is not the text of its token ids (from character")


def test_usage_that_counts_a_token_twice_or_an_answer_without_ids_is_not_whole() -> None:
    assert whole(_answer([" a", " b"], [1, 2], 3)) == "usage says 3 tokens, 2 were generated"
    assert whole(_answer([" a"], [])) == "no token ids were recorded"
    two_ids = _answer([" a"], [1])
    two_ids.chunks[1]["id"] = "y"
    assert whole(two_ids) == "its chunks name more than one id or created"


def test_an_arm_whose_resumed_answer_was_not_whole_fails() -> None:
    taken = {"taken_back": 3, "mid_answer": 2, "broken": 1, "first_broken": "j: why"}
    arm = arm_summary(_load([None]), 0.01, _ENGINE, _CPU, fairq_preemptions=taken)
    assert arm["status"] == "FAILED"
    assert arm["failed"]["first_error"] == "a resumed answer was not whole: j: why"
    fine = arm_summary(_load([None]), 0.01, _ENGINE, _CPU, fairq_preemptions=taken | {"broken": 0})
    assert fine["status"] == "ok" and fine["fairq_preemptions"]["mid_answer"] == 2


def test_arm_k_asks_the_engine_for_token_ids_as_fairqs_workers_do() -> None:
    assert ARMS["k"].token_ids and not ARMS["k"].via_fairq and not ARMS["a"].token_ids
    asking = Target("u", "m", token_ids=True).body("hi", 5, stream=True, heavy=True)
    assert asking["return_token_ids"] is True
    assert "return_token_ids" not in Target("u", "m").body("hi", 5, stream=True, heavy=True)


class _CountingEngine:
    """An ASGI chat endpoint that answers every request after a short wait, counting the
    most requests open at once."""

    def __init__(self) -> None:
        self.open = 0
        self.most_open = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        await asyncio.sleep(0.02)
        self.open -= 1
        body = json.dumps({"usage": {"completion_tokens": 5}}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def test_arm_n_sends_the_flood_as_the_window_frees_and_arm_a_all_at_once() -> None:
    assert ARMS["n"].heavy_window and not ARMS["n"].via_fairq and not ARMS["a"].heavy_window
    plan = [Planned("A", True, 0.0, 8, 5, False) for _ in range(12)]
    engine = _CountingEngine()
    with uvicorn_thread(engine, lifespan="off") as url:
        target = Target(f"{url}/v1/chat/completions", "m")
        windowed = asyncio.run(run_load(target, plan, 30.0, heavy_window=3))
        assert engine.most_open == 3
        engine.most_open = 0
        at_once = asyncio.run(run_load(target, plan, 30.0))
        assert engine.most_open == 12
    for load in (windowed, at_once):
        assert load.failed == [] and load.output_tokens == 12 * 5


class _WhoAsks:
    """An ASGI chat endpoint that records, per user, the processes its requests came from
    (the owner of the client's socket, found while the request is open)."""

    def __init__(self) -> None:
        self.pids: dict[str, set[int]] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        user = json.loads(body)["messages"][0]["content"].split()[0].strip("[")
        port = scope["client"][1]
        owners = {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port}
        self.pids.setdefault(user, set()).update(p for p in owners if p)
        answer = json.dumps({"usage": {"completion_tokens": 5}}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


def test_light_users_send_from_a_process_of_their_own_and_their_results_come_back() -> None:
    # The flood's streams are read on this process's event loop; a light user's first token
    # waiting behind them would be the load client's wait, not the stack's.
    plan = [Planned("A", True, 0.0, 8, 5, False) for _ in range(4)]
    plan += [Planned("B", False, 0.2, 8, 5, False), Planned("C", False, 0.3, 8, 5, False)]
    engine = _WhoAsks()
    with uvicorn_thread(engine, lifespan="off") as url:
        load = asyncio.run(run_load(Target(f"{url}/v1/chat/completions", "m"), plan, 30.0))
    assert load.failed == [] and load.output_tokens == 6 * 5
    assert engine.pids["A"] == {os.getpid()}
    assert len(engine.pids["B"]) == 1 and engine.pids["B"] == engine.pids["C"]
    assert os.getpid() not in engine.pids["B"]
    light = [r for r in load.requests if not r.heavy]
    assert [r.user for r in light] == ["B", "C"] and all(r.end_s for r in light)
    assert all(0.2 <= r.arrival_s < 5.0 for r in light)  # timed from the same t=0
