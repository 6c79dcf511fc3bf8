"""The fleet benchmark's figures from what the run recorded. Pure, no I/O.

A cold start is a wake: a replica the autoscaler started while its model had no other
that fairq's dispatcher could send to: none starting or ready, and none retired whose
record the dispatcher still held (its DNS read after the record went had not come yet;
with a long discovery interval an old replica goes on serving a while after the
autoscaler counted it gone, and a request it serves is not a cold start). Its first
request is the earliest request of that model sent after the model's previous wake and
after its older replicas left the dispatcher's view, that had no first token yet when the
wake was decided (the request whose demand woke the model); its time to first token runs
from that request's send to the model's first token after it. Its excess over the
replica's startup time splits into the steps on the way:

* detect: from the request to the autoscaler's decision (prometheus: the dispatcher
  publishes the demand every status interval, the autoscaler reads it every polling
  interval; external-push: the scaler's push on the model's first enqueue);
* start: from the decision to the replica's readiness: the host's start of its server
  (launch), the startup time itself, the readiness probe's wait (probe);
* publish: from readiness to the record in DNS;
* serve: from the record in DNS to the first token: the dispatcher's next DNS read (DNS
  read), then its scrape of the new replica, the dispatch, one engine step and the
  stream's way back (answer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.fleet.load import Request
from benchmarks.fleet.replicas import Replica
from benchmarks.lib.stats import markdown_table, pct


@dataclass(frozen=True)
class ColdStart:
    model: str
    cause: str  # what woke it: "push" (StreamIsActive) or "poll" (a metric read)
    first_sent_s: float
    requested_s: float  # the wake: the autoscaler started a replica
    listening_s: float | None
    ready_s: float | None
    published_s: float | None
    found_s: float | None  # the dispatcher's DNS read that found the replica
    first_token_s: float | None
    startup_s: float  # the replica's configured startup time

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.first_sent_s

    def steps(self) -> dict[str, float | None]:
        def between(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        loaded = None if self.listening_s is None else self.listening_s + self.startup_s
        return {
            "detect_s": between(self.first_sent_s, self.requested_s),
            "start_s": between(self.requested_s, self.ready_s),
            "launch_s": between(self.requested_s, self.listening_s),
            "probe_s": between(loaded, self.ready_s),
            "publish_s": between(self.ready_s, self.published_s),
            "serve_s": between(self.published_s, self.first_token_s),
            "dns_read_s": between(self.published_s, self.found_s),
            "answer_s": between(self.found_s, self.first_token_s),
        }


STEPS = ("detect_s", "start_s", "launch_s", "probe_s", "publish_s", "serve_s", "dns_read_s",
         "answer_s")  # fmt: skip
SUBSTEPS = {"launch_s", "probe_s", "dns_read_s", "answer_s"}  # parts of the step above them


def in_view_until(replica: Replica) -> float:
    """Until when the dispatcher could send to ``replica``: its first DNS read after the
    record went (or its stop, if no read came between); one never published, until it
    was retired; one never retired, for ever."""
    if replica.retired_s is None:
        return math.inf
    if replica.published_s is None:
        return replica.retired_s
    if replica.dropped_s is not None:
        return replica.dropped_s
    return math.inf if replica.stopped_s is None else replica.stopped_s


def wakes(replicas: Sequence[Replica]) -> list[Replica]:
    """The replicas started while their model had none in the dispatcher's view (module
    docstring)."""
    out = []
    for replica in replicas:
        alive_before = any(
            other.model == replica.model
            and other.requested_s < replica.requested_s
            and in_view_until(other) > replica.requested_s
            for other in replicas
        )
        if not alive_before:
            out.append(replica)
    return sorted(out, key=lambda r: r.requested_s)


def cold_starts(
    requests: Sequence[Request], replicas: Sequence[Replica], startup_s: float
) -> list[ColdStart]:
    by_model: dict[str, list[Request]] = {}
    for request in sorted(requests, key=lambda r: r.sent_s):
        by_model.setdefault(request.model, []).append(request)
    previous: dict[str, float] = {}
    out = []
    for wake in wakes(replicas):
        gone = [in_view_until(r) for r in replicas
                if r.model == wake.model and r.requested_s < wake.requested_s]  # fmt: skip
        after = max([previous.get(wake.model, -math.inf), *gone])
        previous[wake.model] = wake.requested_s
        mine = [r for r in by_model.get(wake.model, []) if r.sent_s > after]
        waiting = [r for r in mine if r.sent_s <= wake.requested_s and not _served_by(r, wake)]
        if not waiting:
            continue  # nothing was waiting: not a request's cold start (cannot happen here)
        first = waiting[0]
        tokens = [r.first_token_s for r in mine if r.sent_s >= first.sent_s and r.first_token_s]
        out.append(ColdStart(wake.model, wake.cause, first.sent_s, wake.requested_s,
                             wake.listening_s, wake.ready_s, wake.published_s, wake.found_s,
                             min(tokens) if tokens else None, startup_s))  # fmt: skip
    return out


def _served_by(request: Request, moment: Replica) -> bool:
    """Whether ``request`` had its first token before ``moment``'s wake."""
    return request.first_token_s is not None and request.first_token_s < moment.requested_s


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """Median, 95th percentile and maximum, rounded to the millisecond."""
    if not values:
        return {"p50": None, "p95": None, "max": None}
    return {"p50": round(pct(values, 50), 3), "p95": round(pct(values, 95), 3),
            "max": round(max(values), 3)}  # fmt: skip


def cold_figures(
    starts: Sequence[ColdStart], startup_s: float, bounds_s: dict[str, float]
) -> dict[str, object]:
    """The cold starts' TTFT, excess over the startup time, its steps, and how many
    exceed each bound (``bounds_s``: name -> seconds)."""
    ttfts = [s.ttft_s for s in starts if s.ttft_s is not None]
    excess = [t - startup_s for t in ttfts]
    steps: dict[str, list[float]] = {}
    for start in starts:
        for name, value in start.steps().items():
            if value is not None:
                steps.setdefault(name, []).append(value)
    causes: dict[str, int] = {}
    for start in starts:
        causes[start.cause] = causes.get(start.cause, 0) + 1
    return {
        "count": len(starts),
        "served": len(ttfts),
        "woken_by": causes,
        "ttft_s": spread(ttfts),
        "excess_s": spread(excess),
        "steps_s": {name: spread(values) for name, values in steps.items()},
        "below_startup": sum(1 for t in ttfts if t < startup_s),
        "over": {name: sum(1 for e in excess if e > bound) for name, bound in bounds_s.items()},
    }


def lost(requests: Sequence[Request], max_tokens: int) -> list[Request]:
    """Requests sent whose whole answer did not come exactly once."""
    return [r for r in requests if not r.complete(max_tokens)]


def duplicate_jobs(requests: Sequence[Request]) -> int:
    """Job ids that answered more than one request (each request must be its own job)."""
    ids = [r.job_id for r in requests if r.job_id is not None]
    return len(ids) - len(set(ids))


def _cell(spread_: object, key: str) -> object:
    value = spread_.get(key) if isinstance(spread_, dict) else None
    return "-" if value is None else value


def table(result: dict[str, object]) -> str:
    """The report's markdown: the cold starts' figures, then the run's."""
    cold = result["cold_starts"]
    terms = result["bound_terms_s"]
    assert isinstance(cold, dict) and isinstance(terms, dict)
    rows: list[tuple[object, ...]] = [
        ("cold start TTFT", _cell(cold["ttft_s"], "p50"), _cell(cold["ttft_s"], "p95"),
         _cell(cold["ttft_s"], "max")),
        ("excess = TTFT - startup", _cell(cold["excess_s"], "p50"),
         _cell(cold["excess_s"], "p95"), _cell(cold["excess_s"], "max")),
    ]  # fmt: skip
    steps = cold["steps_s"]
    assert isinstance(steps, dict)
    for name in STEPS:
        if name in steps:
            label = f"{'    ' if name in SUBSTEPS else '  step: '}{name[:-2].replace('_', ' ')}"
            rows.append((label, _cell(steps[name], "p50"), _cell(steps[name], "p95"),
                         _cell(steps[name], "max")))  # fmt: skip
    head = (
        f"Simulator: estimates. {result['models']} models, replica startup "
        f"{result['startup_s']} s, {result['machine']['cores']} cores; "  # type: ignore[index]
        f"{cold['count']} cold starts."
    )
    bound = ", ".join(f"{k} {v}" for k, v in terms.items())
    lines = [head, "", markdown_table(("seconds", "p50", "p95", "max"), rows), ""]
    over = cold["over"]
    assert isinstance(over, dict)
    trigger_terms, issue_terms = result["trigger_terms"], result["issue_terms_s"]
    woken_by = cold["woken_by"]
    assert isinstance(trigger_terms, list) and isinstance(issue_terms, dict)
    assert isinstance(woken_by, dict)
    waits = " + ".join(str(t) for t in trigger_terms)
    issue = " + ".join(f"{k} {v}" for k, v in issue_terms.items())
    woken = ", ".join(f"{n} by {cause}" for cause, n in woken_by.items())
    lines.append(f"Trigger: {result['trigger']}; cold starts woken: {woken or 'none'}. "
                 f"Bound terms (s): {bound}; their sum {result['bound_s']} s: cold starts "
                 f"over it: {over['bound']}. The trigger's waits ({waits}) "
                 f"{result['trigger_bound_s']} s: over it: {over['trigger_bound']}.")  # fmt: skip
    lines.append(f"The issue's bound, one scrape interval + one engine step ({issue}): "
                 f"{result['issue_bound_s']} s: over it: {over['issue_bound']}; with the "
                 f"readiness probe (Kubernetes's) {result['issue_bound_with_probe_s']} s: "
                 f"over it: {over['issue_bound_with_probe']}. TTFT below the startup time: "
                 f"{cold['below_startup']}.")  # fmt: skip
    run = result["run"]
    assert isinstance(run, dict)
    other = [
        ("requests sent", run["requests"]),
        ("requests lost (no whole answer exactly once)", run["lost"]),
        ("request TTFT p50 / p95 s (all)", f"{run['ttft_p50_s']} / {run['ttft_p95_s']}"),
        ("replicas started / stopped", f"{run['replicas_started']} / {run['replicas_stopped']}"),
        ("most replicas at once", run["max_replicas"]),
        ("engine answers (replicas' request_success_total)", run["engine_answers"]),
        ("dispatcher CPU s over the load (% of one core)",
         f"{run['dispatcher_cpu_s']} ({run['dispatcher_cpu_pct']} %)"),
        ("DNS questions a second over the load (the dispatcher's reads)",
         run["dns_questions_per_s"]),
        ("load wall s", run["load_wall_s"]),
    ]  # fmt: skip
    if "pushes_active" in run:
        other += [
            ("StreamIsActive messages active / inactive",
             f"{run['pushes_active']} / {run['pushes_inactive']}"),
            ("keda-scaler CPU s over the load", run["cpu_s_over_load"].get("keda-scaler")),
        ]  # fmt: skip
    lines += ["", markdown_table(("run", "value"), other)]
    return "\n".join(lines)
