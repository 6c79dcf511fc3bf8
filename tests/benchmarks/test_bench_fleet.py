"""``fairq bench fleet``: the real harness on a tiny run, and its pure parts.

The integration test runs 5 models whose replicas start in 1 s with real processes
(the DNS server, replica hosts, Redis, dispatcher, worker, gateway), and checks the
report's shape, that no request was lost, that each cold start's first token came no
sooner than its replica's startup time, and that the fleet went back to zero with every
replica drained. It asserts nothing about speed, which depends on the machine. Every
process is stopped by the harness, pass or fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import dns.resolver
from click.testing import CliRunner

from benchmarks._fleet_dns import Zone, dns_server
from benchmarks._fleet_keda import ModelScale, Rules, hpa_desired, target
from benchmarks._fleet_load import Request
from benchmarks._fleet_replicas import Replica
from benchmarks._fleet_report import cold_starts, lost, wakes
from benchmarks._fleet_scaler import demand_by_model
from fairq.cli import main

STARTUP_S = 1.0
TINY = [
    "--models", "5", "--startup-s", str(STARTUP_S), "--users", "4", "--duration-s", "8",
    "--cooldown-s", "2", "--max-tokens", "8", "--tail-s", "30", "--hosts", "1",
]  # fmt: skip
RULES = Rules(demand_per_replica=2, max_replicas=3, cooldown_s=10, scale_down_period_s=2)


def test_a_tiny_fleet_run_loses_nothing_and_no_cold_start_beats_its_startup(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(main, ["bench", "fleet", *TINY, "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures == json.loads((tmp_path / "fleet.json").read_text())
    assert figures["engine"] == "simulator (estimates)" and figures["machine"]["cores"] >= 1
    run = figures["run"]
    assert run["requests"] > 0 and run["lost"] == 0 and run["duplicate_job_ids"] == 0
    assert run["errors"] == []
    # Every answer was computed once by an engine: no retry ran a request twice.
    assert run["engine_answers"] == run["requests"]
    assert run["back_to_zero"] and run["replicas_started"] == run["replicas_stopped"] > 0
    # Each replica that served was drained to idle before it stopped (one removed while
    # it still started was never published, so it had nothing to drain).
    assert run["drains_timed_out"] == 0
    assert run["replicas_drained_idle"] + run["stopped_before_ready"] == run["replicas_started"]
    assert run["dispatcher_cpu_s"] > 0 and 0 < run["dispatcher_cpu_pct"] < 100
    cold = figures["cold_starts"]
    assert cold["count"] >= 1 and cold["served"] == cold["count"]
    assert cold["below_startup"] == 0
    for start in figures["cold_start_list"]:
        assert start["ttft_s"] >= STARTUP_S
        assert start["first_sent_s"] <= start["requested_s"] < start["ready_s"]
        assert start["ready_s"] <= start["published_s"] < start["first_token_s"]
    assert set(cold["steps_s"]) == {"detect_s", "start_s", "publish_s", "serve_s"}
    assert figures["bound_s"] == round(sum(figures["bound_terms_s"].values()), 3)
    table = (tmp_path / "fleet.md").read_text()
    assert "Simulator: estimates" in table and "requests lost" in table
    assert "excess = TTFT - startup" in table and "cores" in table


# --- KEDA's rules ------------------------------------------------------------------------


def test_the_hpa_count_is_the_demand_over_the_threshold_rounded_up_within_bounds() -> None:
    assert [hpa_desired(d, RULES) for d in (0, 0.5, 2, 2.1, 4, 5, 100)] == [1, 1, 1, 2, 2, 3, 3]


def test_a_model_at_zero_wakes_on_its_first_job_and_goes_back_after_the_cooldown() -> None:
    state = ModelScale()
    assert target(state, 0, 0, 0.0, RULES) == 0  # never active: stays at zero
    assert target(state, 1, 0, 1.0, RULES) == 1  # activation: above 0
    assert target(state, 0, 1, 5.0, RULES) == 1  # inactive, within the cooldown
    assert target(state, 0, 1, 10.9, RULES) == 1
    assert target(state, 0, 1, 11.0, RULES) == 0  # cooldown since the last demand


def test_scale_up_is_at_once_and_scale_down_waits_for_the_window_one_at_a_time() -> None:
    state = ModelScale()
    assert target(state, 6, 0, 0.0, RULES) == 3
    assert target(state, 1, 3, 1.0, RULES) == 3  # the window still holds the 3
    assert target(state, 1, 3, 10.5, RULES) == 2  # out of the window: one replica goes
    assert target(state, 1, 2, 11.0, RULES) == 2  # one per scale-down period
    assert target(state, 1, 2, 12.6, RULES) == 1


# --- the autoscaler's read ---------------------------------------------------------------


def test_the_demand_is_read_per_model_from_the_dispatchers_page() -> None:
    page = "\n".join([
        "# HELP fairq_model_demand Jobs queued in every band plus jobs in flight",
        "# TYPE fairq_model_demand gauge",
        'fairq_model_demand{model="a"} 3.0',
        'fairq_model_demand{model="b"} 0.0',
        'fairq_model_demand_total{model="c"} 9.0',
        'fairq_model_inflight{model="a"} 1.0',
    ])  # fmt: skip
    assert demand_by_model(page) == {"a": 3.0, "b": 0.0}


# --- the cold starts ---------------------------------------------------------------------


def _replica(model: str, requested: float, retired: float | None) -> Replica:
    return Replica(model, "127.1.1.1", 0, requested, ready_s=requested + 1,
                   published_s=requested + 1, retired_s=retired)  # fmt: skip


def _request(model: str, sent: float, first_token: float | None) -> Request:
    return Request(model, "u", sent, first_token_s=first_token)


def test_a_cold_start_runs_from_the_request_that_woke_the_model_to_its_first_token() -> None:
    replicas = [
        _replica("m", 10.0, 30.0),  # a wake
        _replica("m", 12.0, 25.0),  # a scale-up while the first lives: no wake
        _replica("m", 40.5, None),  # a wake again, after the model went to zero
        _replica("n", 11.0, None),
    ]
    assert [(r.model, r.requested_s) for r in wakes(replicas)] == [
        ("m", 10.0), ("n", 11.0), ("m", 40.5)]  # fmt: skip
    requests = [
        _request("m", 9.2, 11.3),  # woke it
        _request("m", 9.5, 11.2),  # waited too, and got the model's first token
        _request("m", 20.0, 20.1),  # warm
        _request("m", 40.0, 41.8),  # woke it again
        _request("n", 10.6, None),  # lost: its cold start has no first token
    ]
    starts = cold_starts(requests, replicas)
    assert [(s.model, s.first_sent_s, s.first_token_s) for s in starts] == [
        ("m", 9.2, 11.2), ("n", 10.6, None), ("m", 40.0, 41.8)]  # fmt: skip
    first = starts[0]
    assert first.ttft_s is not None and abs(first.ttft_s - 2.0) < 1e-9
    steps = first.steps()
    assert steps["detect_s"] is not None and abs(steps["detect_s"] - 0.8) < 1e-9
    assert steps["start_s"] == 1.0 and steps["publish_s"] == 0.0
    assert lost(requests, 8) == requests  # none of these hand-made answers is whole


def test_a_whole_answer_is_every_token_its_usage_and_one_done() -> None:
    whole = Request("m", "u", 0.0, tokens=8, usage_tokens=8, done_events=1)
    assert lost([whole], 8) == []
    for broken in (
        Request("m", "u", 0.0, tokens=9, usage_tokens=8, done_events=1),  # a token twice
        Request("m", "u", 0.0, tokens=8, usage_tokens=8, done_events=0),  # cut before the end
        Request("m", "u", 0.0, tokens=8, usage_tokens=8, done_events=1, error="error event"),
    ):
        assert lost([broken], 8) == [broken]


# --- the Service's records ---------------------------------------------------------------


def test_the_dns_server_answers_the_ready_replicas_and_nxdomain_for_no_service() -> None:
    zone = Zone()
    zone.set("engine-a.fleet.local", [])
    with dns_server(zone) as nameserver:
        host, port = nameserver.split(":")
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = [host], int(port), 5.0

        def names(name: str) -> list[str] | str:
            try:
                return sorted(a.to_text() for a in resolver.resolve(name, "A"))
            except dns.resolver.NoAnswer:
                return "no answer"
            except dns.resolver.NXDOMAIN:
                return "nxdomain"

        assert names("engine-a.fleet.local") == "no answer"  # a Service with no ready pod
        zone.add("engine-a.fleet.local", "127.1.0.2")
        zone.add("engine-a.fleet.local", "127.1.0.3")
        assert names("engine-a.fleet.local.") == ["127.1.0.2", "127.1.0.3"]
        zone.discard("engine-a.fleet.local", "127.1.0.2")
        assert names("ENGINE-A.fleet.local") == ["127.1.0.3"]
        assert names("engine-b.fleet.local") == "nxdomain"
