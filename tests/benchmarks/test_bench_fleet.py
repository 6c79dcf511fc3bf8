"""``fairq bench fleet``: the real harness on a tiny run, and its pure parts.

The integration test runs 5 models whose replicas start in 1 s with real processes
(the DNS server, replica hosts, Redis, dispatcher, worker, gateway, ``fairq
keda-scaler`` called over gRPC as KEDA's external-push trigger), and checks the report's
shape, that no request was lost, that each cold start was woken by a push and its first
token came no sooner than its replica's startup time, and that the fleet went back to
zero with every replica drained. It asserts nothing about speed, which depends on the
machine. Every process is stopped by the harness, pass or fail.

The push autoscaler's decisions, KEDA's rules, the report's cold starts (with a long DNS
interval too) and the DNS server are tested on hand-made values.
"""

from __future__ import annotations

import json
from pathlib import Path

import dns.resolver
from click.testing import CliRunner

from benchmarks.fleet.dns import Zone, dns_server
from benchmarks.fleet.keda import ModelScale, Rules, hpa_desired, on_push, target
from benchmarks.fleet.load import Request
from benchmarks.fleet.push import PushDecisions
from benchmarks.fleet.replicas import Replica
from benchmarks.fleet.report import STEPS, cold_figures, cold_starts, lost, wakes
from benchmarks.fleet.scaler import demand_by_model
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
    assert run["dns_questions_per_s"] > 0  # 5 models read at least every interval_s
    # The push path: every stream sent its first state (inactive), and woke the models.
    assert run["pushes_inactive"] >= 5 and run["pushes_active"] >= 1
    assert run["woken_by_push"] >= 1 and run["stream_failures"] == 0
    assert run["autoscaler_polls"] > 0 and run["autoscaler_failed_polls"] == 0
    assert run["cpu_s_over_load"]["keda-scaler"] > 0
    cold = figures["cold_starts"]
    assert figures["trigger"] == "external-push"
    assert cold["count"] >= 1 and cold["served"] == cold["count"]
    assert cold["below_startup"] == 0
    assert sum(cold["woken_by"].values()) == cold["count"]
    for start in figures["cold_start_list"]:
        assert start["ttft_s"] >= STARTUP_S
        assert start["first_sent_s"] <= start["requested_s"] < start["listening_s"]
        assert start["listening_s"] < start["ready_s"] <= start["published_s"]
        assert start["published_s"] <= start["found_s"] < start["first_token_s"]
    assert set(cold["steps_s"]) == set(STEPS)
    assert figures["bound_s"] == round(sum(figures["bound_terms_s"].values()), 3)
    assert figures["trigger_terms"] == ["DNS read while waking (waking_interval_s)", "engine step"]
    # The bound: fairq's engine scrape interval (0.2 s) + one engine step (25 ms),
    # and beside it with Kubernetes's readiness probe (0.1 s).
    assert figures["issue_terms_s"] == {"engine scrape (scrape_interval_s)": 0.2,
                                        "engine step": 0.025}  # fmt: skip
    assert figures["issue_bound_s"] == 0.225 and figures["issue_bound_with_probe_s"] == 0.325
    assert set(cold["over"]) == {"bound", "trigger_bound", "issue_bound",
                                 "issue_bound_with_probe"}  # fmt: skip
    assert cold["over"]["issue_bound"] >= cold["over"]["issue_bound_with_probe"]
    table = (tmp_path / "fleet.md").read_text()
    assert "Simulator: estimates" in table and "requests lost" in table
    assert "excess = TTFT - startup" in table and "cores" in table
    assert "Trigger: external-push" in table and "dns read" in table
    assert "The issue's bound, one scrape interval + one engine step" in table
    assert "with the readiness probe (Kubernetes's) 0.325 s" in table


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


# --- the push autoscaler (KEDA on the external-push trigger) -----------------------------


class _Deployments:
    """Each model's replica count, as the pure decisions see it, and each change asked."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.changes: list[tuple[str, int, str]] = []

    def live(self, model: str) -> int:
        return self.counts.get(model, 0)

    def resize(self, model: str, wanted: int, cause: str) -> None:
        self.changes.append((model, wanted, cause))
        self.counts[model] = wanted

    def decisions(self) -> PushDecisions:
        return PushDecisions(RULES, self.live, self.resize)


def test_an_active_push_wakes_a_model_at_zero_at_once_and_inactive_ones_change_nothing() -> None:
    fleet = _Deployments()
    keda = fleet.decisions()
    keda.pushed("m", False, 0.0)  # the stream's first state
    assert fleet.changes == []
    keda.pushed("m", True, 1.0)
    assert fleet.changes == [("m", 1, "push")] and keda.woken_by_push == 1
    keda.pushed("m", True, 2.0)  # already up: the HPA keeps the count, no second wake
    keda.pushed("m", False, 3.0)  # KEDA leaves the step to zero to its polling loop
    assert fleet.changes == [("m", 1, "push")] and keda.woken_by_push == 1
    assert keda.pushes == {True: 2, False: 2}


def test_the_poll_scales_on_the_metric_over_the_spec_target_and_to_zero_after_cooldown() -> None:
    fleet = _Deployments()
    keda = fleet.decisions()
    keda.targets["m"] = 4.0  # GetMetricSpec's target, not the rules' default of 2
    keda.pushed("m", True, 0.0)
    keda.polled({"m": (9.0, True)}, 0.5)
    assert fleet.counts["m"] == 3  # ceil(9 / 4), within max_replicas 3
    keda.polled({"m": (0.0, False)}, 5.0)  # inactive, within the cooldown: the window holds
    assert fleet.counts["m"] == 3
    keda.polled({}, 11.0)  # past the cooldown, but every call failed: KEDA keeps them
    assert fleet.counts["m"] == 3
    keda.polled({"m": (0.0, False)}, 11.5)  # cooldown since the last active poll (0.5 s)
    assert fleet.changes[-1] == ("m", 0, "poll") and keda.polls == 4


def test_an_active_push_above_zero_restarts_the_cooldown() -> None:
    fleet = _Deployments()
    keda = fleet.decisions()
    keda.pushed("m", True, 0.0)
    keda.pushed("m", True, 8.0)  # a new job at one replica: LastActiveTime, no scale
    keda.polled({"m": (0.0, False)}, 12.0)  # 12 s after the wake, 4 s after the push
    assert fleet.counts["m"] == 1
    keda.polled({"m": (0.0, False)}, 18.5)
    assert fleet.counts["m"] == 0


def test_on_push_is_keda_s_request_scale_on_an_active_message() -> None:
    state = ModelScale()
    assert on_push(state, False, 0, 1.0, RULES) == 0 and state.last_active_s is None
    assert on_push(state, True, 0, 2.0, RULES) == 1 and state.last_active_s == 2.0
    assert on_push(state, True, 2, 3.0, RULES) == 2 and state.last_active_s == 3.0
    with_min = Rules(demand_per_replica=2, max_replicas=3, cooldown_s=10,
                     scale_down_period_s=2, min_replicas=2)  # fmt: skip
    assert on_push(ModelScale(), True, 0, 0.0, with_min) == 2


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


def _replica(
    model: str, requested: float, retired: float | None, dropped: float | None = None
) -> Replica:
    return Replica(model, "127.1.1.1", 0, requested, listening_s=requested, ready_s=requested + 1,
                   published_s=requested + 1, retired_s=retired,
                   dropped_s=retired if dropped is None else dropped)  # fmt: skip


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
    starts = cold_starts(requests, replicas, startup_s=1.0)
    assert [(s.model, s.first_sent_s, s.first_token_s) for s in starts] == [
        ("m", 9.2, 11.2), ("n", 10.6, None), ("m", 40.0, 41.8)]  # fmt: skip
    first = starts[0]
    assert first.ttft_s is not None and abs(first.ttft_s - 2.0) < 1e-9
    steps = first.steps()
    assert steps["detect_s"] is not None and abs(steps["detect_s"] - 0.8) < 1e-9
    assert steps["start_s"] == 1.0 and steps["publish_s"] == 0.0
    assert steps["launch_s"] == 0.0 and steps["probe_s"] == 0.0
    assert steps["dns_read_s"] is None  # no DNS read was noted on these replicas
    assert lost(requests, 8) == requests  # none of these hand-made answers is whole


def test_a_replica_the_dispatcher_still_reads_after_its_record_went_is_no_cold_start() -> None:
    # A long DNS interval (5 s): the model went to zero at 20.0 (record removed), but the
    # dispatcher reads DNS again only at 24.5, and until then sends to the old replica.
    # A request at 21.0 wakes the model by push at 21.005; the old replica answers it at
    # 21.05: not a cold start (it once counted as one of 0.05 s, "under the startup time").
    replicas = [
        _replica("m", 0.0, 20.0, dropped=24.5),
        _replica("m", 21.005, 40.0, dropped=40.4),  # the push's replica; gone at 40.4
        _replica("m", 41.0, None),  # a real cold start: no replica left in view
    ]
    requests = [
        _request("m", 21.0, 21.05),
        _request("m", 21.5, 21.53),
        _request("m", 40.2, 40.25),  # the second replica, still in view, served it
        _request("m", 40.99, 42.2),
    ]
    assert [r.requested_s for r in wakes(replicas)] == [0.0, 41.0]
    starts = cold_starts(requests, replicas, startup_s=1.0)
    assert [(s.first_sent_s, s.first_token_s) for s in starts] == [(40.99, 42.2)]
    figures = cold_figures(starts, 1.0, {"bound": 0.5})
    assert figures["below_startup"] == 0 and figures["count"] == 1
    # A replica removed while it still started was never in view: gone when retired.
    never_published = Replica("n", "127.1.1.2", 0, 0.0, retired_s=2.0)
    assert [r.requested_s for r in wakes([never_published, _replica("n", 3.0, None)])] == [
        0.0, 3.0]  # fmt: skip


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
