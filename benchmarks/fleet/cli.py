"""`fairq bench fleet`: many models whose engines scale with fairq's demand, to zero and back.

All on this machine: ``--models`` models (default 60), each a headless Service's DNS name
(``dns``) that fairq's dispatcher reads for the model's replicas (``discovery``),
none at first. An autoscaler applies KEDA's rules (``keda``) on the trigger
``fairq k8s render`` writes (``--trigger``): ``external-push`` (the default, as rendered)
runs ``fairq keda-scaler`` as a process of its own on the stack's Redis and calls it as
KEDA does (``push``: a StreamIsActive stream per model that wakes a model at zero
at once, GetMetrics and IsActive every ``--poll-s``); ``prometheus`` reads each model's
``fairq_model_demand`` from the dispatcher's ``/metrics`` every ``--poll-s``
(``scaler``). Either starts and stops simulated replicas (``replicas``:
each answers 503 for ``--startup-s`` as a pod loading its weights, is published in DNS
once ready, and is drained with fairq's preStop drain before it stops). A load of
``--users`` users streams chat completions through fairq's gateway to a Zipf mix of the
models, so that a few are hot and the rest often at zero when a request comes.

Reported: each cold start's time from the model's first request to its first token
against the startup time, the excess and its steps (``report``); requests lost
(every request must get its whole answer exactly once); the dispatcher's CPU over the
load; replicas started and stopped. The engines are the simulator's: estimates.

Every process is stopped when the run ends, however it ends; the run is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import psutil
import yaml

from benchmarks.fleet.dns import Zone, dns_server
from benchmarks.fleet.keda import Rules
from benchmarks.fleet.load import LoadRun, LoadShape, run_load, zipf_mix
from benchmarks.fleet.push import PushScaler, PushScalerError, scaler_process
from benchmarks.fleet.replicas import Fleet, dns_name, replica_hosts
from benchmarks.fleet.report import cold_figures, cold_starts, duplicate_jobs, lost, table
from benchmarks.fleet.scaler import Scaler
from benchmarks.lib.stats import machine, pct, save
from broker import hash_key
from fairq.runtime import environment
from fairq.stack.localredis import free_port
from fairq.stack.processes import Stack

APP_KEY = "fq-bench-fleet-app"
BATCH = 16  # the replicas' max_num_seqs
START_TIMEOUT_S = 60.0
ZERO_WAIT_S = 30.0  # after the cooldown, the longest wait for the fleet to reach zero
_QUIET = {"FAIRQ_LOG_LEVEL": "WARNING"}
TRIGGERS = ("external-push", "prometheus")
WAKING_READ = "DNS read while waking (waking_interval_s)"
SCRAPE = "engine scrape (scrape_interval_s)"
STEP = "engine step"
PROBE = "readiness probe"
# The issue's bound on a cold start's excess: "at most one scrape interval + one engine
# step", the scrape interval being fairq's engine scrape (a replica that appears gets
# admissions within one once healthy). The readiness probe's period is Kubernetes's (the
# pod is not ready before it): reported beside it, as a second bound with the probe added.
ISSUE_TERMS = (SCRAPE, STEP)
# Each trigger's own waits beyond the startup, the bound it keeps by its mechanism (the
# other terms of ``bound_terms_s`` are reported beside it). Prometheus: the demand's
# publish and the autoscaler's poll. External push: the wake is a push (milliseconds,
# measured as the detect step), and the interval on a cold start's way is the
# dispatcher's DNS read while the model wakes; a replica found is scraped at once
# (``dispatcher.service``'s ``_found``).
TRIGGER_TERMS = {
    "prometheus": ("demand publish (status_interval_s)", "autoscaler poll", STEP),
    "external-push": (WAKING_READ, STEP),
}


@dataclass(frozen=True)
class Options:
    models: int
    startup_s: float
    load: LoadShape
    zipf: float
    rules: Rules
    poll_s: float
    status_interval_s: float
    discovery_interval_s: float
    waking_interval_s: float
    scrape_interval_s: float
    probe_s: float
    step_ms: float
    hosts: int
    trigger: str = "external-push"

    @property
    def bound_terms_s(self) -> dict[str, float]:
        """Each wait on a cold start's way beyond the startup time, at most (the push and
        the other round trips are measured, not bounded here)."""
        # A model with jobs and no healthy replica reads its records this often.
        waking = min(self.waking_interval_s, self.discovery_interval_s)
        step = self.step_ms / 1000
        if self.trigger == "external-push":
            return {PROBE: self.probe_s, WAKING_READ: waking, STEP: step}
        return {
            "demand publish (status_interval_s)": self.status_interval_s,
            "autoscaler poll": self.poll_s,
            PROBE: self.probe_s,
            WAKING_READ: waking,
            SCRAPE: self.scrape_interval_s,
            STEP: step,
        }

    @property
    def issue_terms_s(self) -> dict[str, float]:
        """The issue's bound's terms (``ISSUE_TERMS``), whatever the trigger."""
        return {SCRAPE: self.scrape_interval_s, STEP: self.step_ms / 1000}


def say(message: str) -> None:
    click.echo(f"fleet: {message}", err=True)


def model_names(count: int) -> list[str]:
    """In order of popularity: the first is the hottest."""
    return [f"fleet-m{i:03d}" for i in range(count)]


def profile(options: Options) -> dict[str, Any]:
    """The replicas' sim profile: a small engine whose step is ``step_ms``."""
    return {"max_num_seqs": BATCH, "step_base_ms": options.step_ms, "step_per_seq_ms": 0.5,
            "default_output_tokens": options.load.max_tokens,
            "enable_prefix_caching": False}  # fmt: skip


def fairq_config(options: Options, nameserver: str, port: int) -> dict[str, Any]:
    """Every model found through its DNS name (no endpoint listed), and one trusted app key
    that names each user."""
    models = [
        {"name": name, "engine": "vllm", "endpoints": [], "batch_slots": BATCH,
         "discovery": {"dns": dns_name(name), "port": port, "nameservers": [nameserver],
                       "interval_s": options.discovery_interval_s,
                       "waking_interval_s": options.waking_interval_s}}
        for name in model_names(options.models)
    ]  # fmt: skip
    key = {"sha256": hash_key(APP_KEY), "user": "app", "trusted_app": True}
    return {"models": models, "api_keys": [key], "max_queued_per_user": 10_000,
            "status_interval_s": options.status_interval_s,
            "scrape_interval_s": options.scrape_interval_s}  # fmt: skip


@contextlib.contextmanager
def fairq(config: dict[str, Any]) -> Iterator[Stack]:
    stack = Stack(config, gateway_port=free_port(), workers=1, batch_workers=0, env=_QUIET)
    stack.start(START_TIMEOUT_S)  # stops what it started if it fails
    try:
        yield stack
    finally:
        stack.stop()


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            out[name] = times.user + times.system
    return out


@contextlib.contextmanager
def keda_scaler(options: Options, stack: Stack) -> Iterator[tuple[str, int] | None]:
    """``fairq keda-scaler`` on the stack's configuration and Redis, for the external-push
    trigger: its address and process id; None for the prometheus trigger."""
    if options.trigger != "external-push":
        yield None
        return
    with scaler_process(stack.env) as started:
        yield started


async def start_scaler(
    options: Options, stack: Stack, fleet: Fleet, scaler_address: str | None, stop: asyncio.Event
) -> tuple[Scaler | PushScaler, asyncio.Task[None]]:
    """The trigger's autoscaler, running: the push one once every model's stream is open."""
    names = tuple(model_names(options.models))
    if scaler_address is None:
        metrics = stack.metrics_url("dispatcher-0")
        scaler = Scaler(fleet, options.rules, metrics, options.poll_s, names)
        return scaler, asyncio.create_task(scaler.run(stop))
    pusher = PushScaler(fleet, options.rules, scaler_address, options.poll_s, names)
    ready = asyncio.Event()
    scaling = asyncio.create_task(pusher.run(ready, stop))
    opened = asyncio.create_task(ready.wait())
    await asyncio.wait([opened, scaling], return_when=asyncio.FIRST_COMPLETED)
    opened.cancel()
    if scaling.done():
        scaling.result()  # raises why it stopped
        raise PushScalerError("the autoscaler stopped before every stream was open")
    return pusher, scaling


async def drive(
    options: Options,
    stack: Stack,
    fleet: Fleet,
    pids: dict[str, int],
    scaler_address: str | None,
) -> dict[str, Any]:
    """The autoscaler and the load; then the fleet back to zero and every replica stopped."""
    names = tuple(model_names(options.models))
    stop = asyncio.Event()
    scaler, scaling = await start_scaler(options, stack, fleet, scaler_address, stop)
    try:
        before, asked = cpu_s(pids), fleet.dns_questions()
        url = f"{stack.gateway_url}/v1/chat/completions"
        load = await run_load(url, APP_KEY, zipf_mix(names, options.zipf), options.load)
        after, asked = cpu_s(pids), fleet.dns_questions() - asked
        say(f"load done: {len(load.requests)} requests; waiting for the fleet to reach zero")
        deadline = time.monotonic() + options.rules.cooldown_s + ZERO_WAIT_S
        while time.monotonic() < deadline and any(fleet.live(m) for m in names):
            await asyncio.sleep(0.2)
        at_zero = not any(fleet.live(m) for m in names)
    finally:
        stop.set()
        await scaling
        await fleet.stop_all(timeout_s=90.0)
        fleet.note_reads()
    return {"load": load, "scaler": scaler, "cpu_before": before, "cpu_after": after,
            "at_zero": at_zero, "dns_questions": asked}  # fmt: skip


def run(options: Options) -> dict[str, Any]:
    zone = Zone()
    names = model_names(options.models)
    for name in names:
        zone.set(dns_name(name), [])  # each Service exists, with no ready pod
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fairq-bench-fleet-") as folder:
        profile_path = Path(folder) / "profile.yaml"
        profile_path.write_text(yaml.safe_dump(profile(options)))
        with (
            dns_server(zone) as nameserver,
            fairq(fairq_config(options, nameserver, port)) as stack,
            replica_hosts(options.hosts, str(profile_path)) as hosts,
            keda_scaler(options, stack) as scaler,
        ):
            pids = {name: p.pid for name, p in stack.processes.items()}
            if scaler is not None:
                pids["keda-scaler"] = scaler[1]
            pids |= {f"replica-host-{i}": pid for i, pid in enumerate(hosts.values())}
            pids["bench (load, autoscaler, DNS)"] = os.getpid()
            say(f"{options.models} models at zero, trigger {options.trigger}; "
                f"load for {options.load.duration_s:g} s")  # fmt: skip
            fleet = Fleet(list(hosts), zone, port, options.startup_s, options.probe_s,
                          settle_s=options.discovery_interval_s + 0.3)  # fmt: skip

            async def main() -> dict[str, Any]:
                try:
                    return await drive(options, stack, fleet, pids, scaler and scaler[0])
                finally:
                    await fleet.aclose()

            outcome = asyncio.run(main())
            outcome["dead"] = stack.dead()
            outcome["fleet"] = fleet
    return report(options, outcome)


def report(options: Options, outcome: dict[str, Any]) -> dict[str, Any]:
    load: LoadRun = outcome["load"]
    fleet: Fleet = outcome["fleet"]
    scaler: Scaler | PushScaler = outcome["scaler"]
    terms = options.bound_terms_s
    bound = round(sum(terms.values()), 3)
    starts = cold_starts(load.requests, fleet.replicas, options.startup_s)
    wall = load.ended_s - load.began_s
    cpu = {n: round(outcome["cpu_after"][n] - outcome["cpu_before"].get(n, 0.0), 2)
           for n in outcome["cpu_after"]}  # fmt: skip
    gone = lost(load.requests, options.load.max_tokens)
    ttfts = [r.first_token_s - r.sent_s for r in load.requests if r.first_token_s is not None]
    errors = sorted(
        {r.error for r in gone if r.error} | {r.error for r in fleet.replicas if r.error}
    )
    run_figures = {
        "requests": len(load.requests),
        "lost": len(gone),
        "duplicate_job_ids": duplicate_jobs(load.requests),
        "engine_answers": sum(r.served or 0 for r in fleet.replicas),
        "ttft_p50_s": round(pct(ttfts, 50), 3) if ttfts else None,
        "ttft_p95_s": round(pct(ttfts, 95), 3) if ttfts else None,
        "replicas_started": sum(1 for r in fleet.replicas if r.listening_s is not None),
        "replicas_stopped": sum(1 for r in fleet.replicas if r.stopped_s is not None),
        "replicas_drained_idle": sum(1 for r in fleet.replicas if r.drain_status == 0),
        "drains_timed_out": sum(1 for r in fleet.replicas if r.drain_status == 1),
        "stopped_before_ready": sum(1 for r in fleet.replicas if r.published_s is None),
        "max_replicas": scaler.max_replicas_seen,
        "autoscaler_polls": scaler.polls,
        "autoscaler_failed_polls": scaler.failed_polls,
        "back_to_zero": outcome["at_zero"],
        "dispatcher_cpu_s": cpu.get("dispatcher-0"),
        "dispatcher_cpu_pct": round(100 * cpu.get("dispatcher-0", 0.0) / wall, 1) if wall else None,
        "cpu_s_over_load": cpu,
        "dns_questions_per_s": round(outcome["dns_questions"] / wall, 1) if wall else None,
        "load_wall_s": round(wall, 1),
        "errors": errors[:10] + ([f"process exited: {outcome['dead']}"] if outcome["dead"] else []),
    }
    if isinstance(scaler, PushScaler):
        run_figures |= {
            "pushes_active": scaler.decisions.pushes[True],
            "pushes_inactive": scaler.decisions.pushes[False],
            "woken_by_push": scaler.decisions.woken_by_push,
            "stream_failures": scaler.stream_failures,
        }
    trigger_terms = TRIGGER_TERMS[options.trigger]
    issue_terms = options.issue_terms_s
    issue_bound = round(sum(issue_terms.values()), 3)
    bounds = {
        "bound": bound,
        "trigger_bound": round(sum(terms[t] for t in trigger_terms), 3),
        "issue_bound": issue_bound,
        "issue_bound_with_probe": round(issue_bound + options.probe_s, 3),
    }
    return {
        "benchmark": "fleet",
        "engine": "simulator (estimates)",
        "machine": machine(),
        "models": options.models,
        "trigger": options.trigger,
        "startup_s": options.startup_s,
        "options": {k: v for k, v in asdict(options).items() if k not in ("load", "rules")}
        | {"load": asdict(options.load), "rules": asdict(options.rules)},
        "bound_terms_s": terms,
        "bound_s": bound,
        "trigger_terms": list(trigger_terms),
        "trigger_bound_s": bounds["trigger_bound"],
        "issue_terms_s": issue_terms,
        "issue_bound_s": issue_bound,
        "issue_bound_with_probe_s": bounds["issue_bound_with_probe"],
        "cold_starts": cold_figures(starts, options.startup_s, bounds),
        "cold_start_list": [asdict(s) | {"ttft_s": s.ttft_s} for s in starts],
        "run": run_figures,
    }


def failures(result: dict[str, Any]) -> list[str]:
    """What makes the run a failure: a request lost, a cold start faster than its startup
    (the measurement is wrong), a process that died, no cold start at all."""
    out = []
    run_figures, cold = result["run"], result["cold_starts"]
    if run_figures["lost"]:
        out.append(f"{run_figures['lost']} requests lost")
    if run_figures["duplicate_job_ids"]:
        out.append(f"{run_figures['duplicate_job_ids']} job ids answered two requests")
    if cold["below_startup"]:
        out.append(f"{cold['below_startup']} cold starts under the startup time")
    if not cold["count"]:
        out.append("no cold start happened")
    out += [e for e in run_figures["errors"] if e.startswith("process exited")]
    return out


@click.command(name="fleet", epilog=environment())
@click.option("--models", default=60, show_default=True, type=click.IntRange(1, 200))
@click.option(
    "--trigger", type=click.Choice(TRIGGERS), default="external-push", show_default=True,
    help="KEDA's trigger, as fairq k8s render writes it",
)  # fmt: skip
@click.option("--startup-s", default=3.0, show_default=True, help="each replica's start-up")
@click.option("--users", default=24, show_default=True, help="users, one request at a time each")
@click.option("--duration-s", default=120.0, show_default=True, help="of sending")
@click.option("--think-s", default="0.5,2.0", show_default=True, help="min,max between requests")
@click.option("--max-tokens", default=32, show_default=True, help="per answer")
@click.option("--zipf", default=1.1, show_default=True, help="the models' popularity exponent")
@click.option("--demand-per-replica", default=2.0, show_default=True, help="trigger threshold")
@click.option("--max-replicas", default=3, show_default=True, help="per model")
@click.option("--cooldown-s", default=10.0, show_default=True, help="KEDA's cooldownPeriod")
@click.option("--scale-down-period-s", default=2.0, show_default=True, help="one replica per")
@click.option("--poll-s", default=0.5, show_default=True, help="the autoscaler's polling interval")
@click.option("--status-interval-s", default=0.5, show_default=True, help="the demand's refresh")
@click.option("--discovery-interval-s", default=0.5, show_default=True, help="DNS reads")
@click.option("--waking-interval-s", default=0.1, show_default=True, help="DNS reads at zero")
@click.option("--scrape-interval-s", default=0.2, show_default=True, help="fairq's engine scrape")
@click.option("--probe-s", default=0.1, show_default=True, help="the readiness probe's period")
@click.option("--step-ms", default=25.0, show_default=True, help="the replicas' engine step")
@click.option("--hosts", default=2, show_default=True, help="replica host processes")
@click.option("--seed", default=1, show_default=True)
@click.option("--tail-s", default=60.0, show_default=True, help="wait for answers after sending")
@click.option("--out", default="bench-out/fleet", show_default=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
def main(**kw: Any) -> None:
    """Many models on simulated replicas that scale with fairq's demand, to zero and back:
    cold-start time to first token against the startup time, requests lost, the
    dispatcher's CPU. Engines are simulated (estimates)."""
    low, _, high = str(kw["think_s"]).partition(",")
    load = LoadShape(users=kw["users"], duration_s=kw["duration_s"],
                     think_s=(float(low), float(high or low)), max_tokens=kw["max_tokens"],
                     tail_s=kw["tail_s"], seed=kw["seed"])  # fmt: skip
    rules = Rules(demand_per_replica=kw["demand_per_replica"], max_replicas=kw["max_replicas"],
                  cooldown_s=kw["cooldown_s"],
                  scale_down_period_s=kw["scale_down_period_s"])  # fmt: skip
    options = Options(models=kw["models"], startup_s=kw["startup_s"], load=load, zipf=kw["zipf"],
                      rules=rules, poll_s=kw["poll_s"], status_interval_s=kw["status_interval_s"],
                      discovery_interval_s=kw["discovery_interval_s"],
                      waking_interval_s=kw["waking_interval_s"],
                      scrape_interval_s=kw["scrape_interval_s"], probe_s=kw["probe_s"],
                      step_ms=kw["step_ms"], hosts=kw["hosts"],
                      trigger=kw["trigger"])  # fmt: skip
    try:
        result = run(options)
    except KeyboardInterrupt:
        say("interrupted; every process was stopped")
        sys.exit(130)
    text = table(result)
    save(kw["out"], "fleet", result, text)
    click.echo(json.dumps(result, indent=1) if kw["as_json"] else text)
    failed = failures(result)
    if failed:
        say(f"FAILED: {'; '.join(failed)}")
        sys.exit(1)
