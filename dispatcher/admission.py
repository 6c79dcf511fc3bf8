"""Admission: may we send to this endpoint now, how many, and which endpoint (pure, no I/O).

An engine like vLLM has one FIFO queue; fairq's fair order only matters if that
queue stays short. So an endpoint has room for ``target(band) - estimate`` more
jobs, where the estimate of its queue is what it last reported waiting beyond fairq's
own jobs without a first token at that scrape (``EndpointState.waiting_beyond``: other
clients' requests, and fairq's jobs the engine does not stream; fairq's own it counts
without lag, so a scrape a second old never holds refills back for jobs that have
started since, or were taken back), plus the larger of

* fairq's jobs that scrape could not show (on their way to it, or handed over within
  the engine's metrics lag), plus what fairq sent it since that may still wait. A
  streamed job (to its client, or from the engine for a whole answer:
  ``StreamMode.WHOLE``) waits in the engine only until its first token, which fairq
  sees at once; so of the streamed jobs handed over just before the scrape and those
  sent since, the ones that still may wait are at most the lag-free count below. A job
  on its way at the scrape, or one the engine does not stream (whose first token is
  invisible until its whole answer), may wait unseen until the next scrape; and
* fairq's own count of jobs sent to it that have not started yet: lag-free. A
  streamed job has started at its first token (so prefill counts too); one the
  engine does not stream once the worker has handed the request to the engine.

The terms read at the scrape stay until the next one, and a newer sample may show
that their jobs have left the engine's queue: ``held_by_unseen`` says when only they
hold a band back, so the dispatcher scrapes again soon rather than on the next tick.

The engine's batch (learned from its metrics, ``dispatcher.capacity``; ``batch_slots``
overrides it) bounds users who already have a job in the engine: they
are admitted only into free batch slots, less the slots kept for users with none
(``reserved_slots``); where slots are kept they also leave one place of the queue target
to newcomers, counted lag-free (their refills wait a step for prefill, and would hold a
newcomer back). For two engine steps after a newcomer is sent (``newcomer_step``) they get
nothing: their prompts would share its prefill step and lengthen it. Their refills go at
about the rate the engine ends requests (``dispatcher.pacing``): sent in bursts, their
prefills would make one long step now and then, and a newcomer arriving during it waits
it out.
While the last scrape saw requests wait with the batch not full (the KV cache is full:
long answers fill it before the slots), the engine takes only what it runs
(``room_in``). So the engine's own queue never holds a heavy user's jobs, a freed
slot is refilled as soon as fairq sees the job end (no scrape lag: fairq counts its jobs in
flight itself), and a newcomer -- a user with nothing in the engine -- finds a kept slot
free, or else waits at the head of the engine's queue for the next slot, never behind
someone else's long generations. ``Decision.room`` is the room for newcomers,
``Decision.served_room`` the part of it open to users already in the engine. With the
batch known, the engine's queue ahead of a newcomer is counted lag-free (``batch_queue``):
fairq's jobs beyond the batch or those without a first token yet, whichever is more --
less the refills the engine's end rate keeps starting at any moment, which share the
newcomer's step rather than wait ahead of it (``pacing.starting_refills``);
fairq's sends since the last scrape add nothing, and what the engine reported waiting
counts only beyond what fairq can have put there.

A queue estimate of 0 with a target of 3 admits 3 at once (a burst). While the
recent time per output token is over the model's ceiling nothing more is
admitted -- unless nothing is running, so the ceiling can never deadlock.
Without fresh metrics the static in-flight cap decides; an unhealthy endpoint
(failing scrapes) gets nothing until it recovers. Never admit blindly.

Policies are chosen by name (``ADMISSION``): ``metrics`` (the above) or
``static`` (the in-flight cap alone, for engines without usable metrics).
``plan_grant`` makes the same decision ahead of time for jobs not queued yet
(express credits, see ``broker.dispatching``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from broker import Grant, ModelConfig
from dispatcher.capacity import kv_bounds


class Limit(enum.StrEnum):
    """Why an endpoint's room is what it is; also the refusal reason in metrics."""

    QUEUE_TARGET = "queue_target"
    BATCH_SLOTS = "batch_slots"  # the batch is full: only users with nothing in it may go
    # Users in the engine have as many jobs waiting there (sent, no first token yet) as the
    # queue target leaves them: only users with nothing in it may go
    REFILLS_WAITING = "refills_waiting"
    NEWCOMER_STEP = "newcomer_step"  # a newcomer's prefill step: only users with nothing in it
    REFILL_PACE = "refill_pace"  # the next refill is not due: only users with nothing in it
    TPOT_CEILING = "tpot_ceiling"
    STALE_METRICS = "stale_metrics"  # fell back to the static cap
    UNHEALTHY = "unhealthy"
    INFLIGHT_CAP = "inflight_cap"


@dataclass(frozen=True)
class EndpointState:
    """What admission knows about one endpoint at one moment."""

    endpoint: str
    inflight: int  # fairq: dispatched and not ended
    unstarted: int = 0  # fairq: dispatched, no first token yet
    healthy: bool = True  # scrapes succeed
    fresh: bool = False  # the last good scrape is recent enough to trust
    waiting: float = 0.0  # engine queue at the last scrape
    running: float = 0.0  # engine batch at the last scrape
    tpot_s: float | None = None  # recent mean time per output token
    unseen_at_scrape: int = 0  # fairq: jobs the last scrape could not show, but for:
    unseen_streamed: int = 0  # those handed over streamed, without a first token then
    unstarted_at_scrape: int = 0  # fairq: jobs without a first token when it was read
    shown_at_scrape: int = 0  # fairq: jobs in the engine that the scrape could show
    admitted_since_scrape: int = 0  # fairq sent these after the last scrape began
    plain_since_scrape: int = 0  # of them not streamed
    batch_seen: int = 0  # the most requests the engine ran while others waited (its batch)
    # The running set at which the last two scrapes found requests waiting (None: not full
    # now; ``dispatcher.capacity``): below ``batch_seen``, its KV cache bounds it
    full_at: int | None = None
    kv_usage: float | None = None  # the engine's KV-cache use at the last scrape, 0..1
    # A newcomer was sent within the last two engine steps: its prefill step is kept clear of
    # refills (``ModelConfig.clear_newcomer_step``)
    newcomer_step: bool = False
    # Refills the pace lets go now (``dispatcher.pacing``; None: no pace known yet), and in
    # how long the next is due
    pace_allowed: int | None = None
    pace_due_in_s: float | None = None
    # Refills the engine's end rate keeps starting at any moment (``pacing.starting_refills``)
    starting_refills: float = 0.0

    @property
    def queue_estimate(self) -> float:
        return self.waiting_beyond + max(self.unseen_now, float(self.unstarted))

    @property
    def waiting_beyond(self) -> float:
        """What the last scrape found waiting beyond fairq's own jobs without a first token
        then: requests of other clients, or fairq's that are not streamed, or started ones
        the engine put back in its queue. fairq's own it counts lag-free: a scrape a second
        old must not hold refills back for jobs that have started since, or were taken
        back."""
        return max(0.0, self.waiting - self.unstarted_at_scrape)

    @property
    def waiting_others(self) -> float:
        """What the last scrape found waiting beyond every job of fairq's there: those
        without a first token and those the engine put back (``put_back``). For the rules
        that count fairq's own lag-free: with KV-bound long answers, after eight put-back
        jobs were taken back for a newcomer, the scrape's count of them held it 190 ms, to
        the next scrape."""
        return max(0.0, self.waiting_beyond - self.put_back)

    @property
    def put_back(self) -> float:
        """fairq's started jobs the engine held in its queue at the last scrape: shown
        beyond its running set, less those without a first token. An engine whose KV
        cache is full puts the requests it preempts there, at the head (vLLM), where a
        newcomer sent since waits behind them."""
        beyond = self.shown_at_scrape - self.running - self.unstarted_at_scrape
        return max(0.0, min(self.waiting, beyond))

    @property
    def kv_full(self) -> bool:
        """The last scrape found the KV cache full: requests wait for blocks, not slots."""
        return self.kv_usage is not None and self.kv_usage >= KV_FULL

    @property
    def waiting_unstarted(self) -> float:
        """fairq's jobs without a first token beyond those the end rate keeps starting:
        with the batch known, the ones that may wait for the engine rather than for its
        next step."""
        return max(0.0, self.unstarted - self.starting_refills)

    @property
    def served_estimate(self) -> float:
        """The queue estimate with the batch known, for users already in the engine: the
        scrape's caution less the refills the end rate keeps starting."""
        own = max(self.unseen_now, float(self.unstarted))
        return self.waiting_beyond + max(0.0, own - self.starting_refills)

    @property
    def unseen_now(self) -> int:
        """fairq's jobs that the last scrape did not show and that may wait in the engine
        now. Each streamed one that still may has no first token yet, so is unstarted."""
        streamed = self.unseen_streamed + self.admitted_since_scrape - self.plain_since_scrape
        return self.unseen_at_scrape + self.plain_since_scrape + min(streamed, self.unstarted)


@dataclass(frozen=True)
class AdmissionConfig:
    targets: Mapping[str, int]  # band -> engine queue target
    tpot_ceiling_s: float
    inflight_cap: int  # the fallback without fresh metrics (and the whole rule of `static`)
    batch_slots: int | None = None  # the engine's batch; None: learned; 0: no batch rule
    reserved_slots: int | None = None  # kept for newcomers; None: one from 32 slots up
    # Jobs of users in the engine that may wait beyond its batch, so that the engine refills
    # a freed slot at once rather than after fairq's round trip. Only with preemption, which
    # takes them back when a newcomer needs the head of the engine's queue, and only while
    # no slot is kept (one sent ahead would take it).
    refill_ahead: int = 0

    @classmethod
    def of(cls, model: ModelConfig, bands: Sequence[str]) -> AdmissionConfig:
        return cls(
            targets={band: model.queue_target(band) for band in bands},
            tpot_ceiling_s=model.tpot_ceiling_ms / 1000,
            inflight_cap=model.inflight_cap,
            batch_slots=model.batch_slots,
            reserved_slots=model.reserved_slots,
            refill_ahead=_REFILL_AHEAD if model.preemption else 0,
        )

    def batch(self, state: EndpointState) -> int | None:
        """The endpoint's batch slots: configured, else learned; None: unknown or off."""
        if self.batch_slots is not None:
            return self.batch_slots or None
        return state.batch_seen or None

    def room_in(self, state: EndpointState) -> int | None:
        """The requests the engine takes now: its batch, or fewer while its KV cache bounds
        it (long answers fill it before the slots): the running set at which the last two
        scrapes found requests waiting (``dispatcher.capacity``), while the cache is at
        least half used, or the one the last scrape saw while requests waited with the
        cache full. Requests that wait once, with KV room left, may wait only for a step's
        prefill budget; and requests that waited below the slots with most of the cache
        free waited for something else than room (a 64-slot engine seen "full" at 61 with
        18% of its cache used held a seed flood's batch at 61: 4.7% of its steps). None:
        the batch is unknown or the rule off."""
        batch = self.batch(state)
        if batch is None:
            return None
        if state.full_at is not None and (state.full_at >= batch or kv_bounds(state.kv_usage)):
            batch = min(batch, state.full_at)
        if not state.kv_full or state.waiting <= 0 or state.running <= 0:
            return batch
        return min(batch, int(state.running))

    def reserve(self, batch: int) -> int:
        """Slots of a batch kept for newcomers; at least one slot stays open to the rest."""
        wanted = self.reserved_slots
        if wanted is None:
            wanted = 1 if batch >= _KEPT_FROM_SLOTS else 0
        return max(0, min(wanted, batch - 1))


# The automatic reserve: one slot kept for newcomers from this many slots up, whatever the
# batch. It is a newcomer's place while another's first answer runs (24 light users at
# 0.5 s apart have about one at a time), not a share of the batch: one per 32 slots kept
# 2 of 64 (3.1% of the steps) where a newcomer needed one. Fewer slots keep none: a slot
# of a small batch is a large share of its throughput (one of 8 on vLLM's CPU build:
# 8.7%), and a newcomer still waits only for the next free slot, at the head of the
# engine's queue (docs/performance.md).
_KEPT_FROM_SLOTS = 32
# KV-cache use from which waiting requests wait for KV blocks (vLLM allocates a request's
# blocks as it grows: with little free, new ones wait while the running ones fill it)
KV_FULL = 0.9
# One job waiting beyond the batch lets the engine refill a freed slot at once, not after
# fairq's round trip of a few engine steps (end seen, next job sent, handed over), which
# short answers would lose as tokens/s. Only with preemption: a newcomer behind that job
# gets a slot by a take-back rather than waiting for the next end.
_REFILL_AHEAD = 1


@dataclass(frozen=True)
class Decision:
    endpoint: str
    room: int  # jobs the endpoint may take now (of users with nothing in the engine)
    limit: Limit
    queue_estimate: float = 0.0
    running: float = 0.0
    served_room: int | None = None  # of ``room``, for users already in the engine (None: all)

    @property
    def room_for_served(self) -> int:
        return self.room if self.served_room is None else min(self.served_room, self.room)


class AdmissionPolicy(Protocol):
    name: str

    def decide(self, state: EndpointState, band: str, config: AdmissionConfig) -> Decision:
        """How many more jobs of ``band`` the endpoint may take now (``room`` >= 0)."""
        ...


def _static(state: EndpointState, config: AdmissionConfig, limit: Limit) -> Decision:
    room = max(0, config.inflight_cap - state.inflight)
    return Decision(state.endpoint, room, limit, float(state.unstarted), 0.0)


class StaticCap:
    name = "static"

    def decide(self, state: EndpointState, band: str, config: AdmissionConfig) -> Decision:
        if not state.healthy:
            return Decision(state.endpoint, 0, Limit.UNHEALTHY)
        return _static(state, config, Limit.INFLIGHT_CAP)


class MetricsAdmission:
    name = "metrics"

    def decide(self, state: EndpointState, band: str, config: AdmissionConfig) -> Decision:
        if not state.healthy:
            return Decision(state.endpoint, 0, Limit.UNHEALTHY)
        if not state.fresh:
            return _static(state, config, Limit.STALE_METRICS)
        batch = config.room_in(state)
        target = config.targets[band]
        estimate = state.queue_estimate if batch is None else batch_queue(state, batch, target)
        busy = state.running > 0 or state.inflight > 0
        if busy and state.tpot_s is not None and state.tpot_s > config.tpot_ceiling_s:
            return Decision(state.endpoint, 0, Limit.TPOT_CEILING, estimate, state.running)
        room = max(0, int(config.targets[band] - estimate))
        if batch is None:
            if config.batch_slots == 0 or target <= 1:
                return Decision(state.endpoint, room, Limit.QUEUE_TARGET, estimate, state.running)
            # Its capacity not learned yet: users already in the engine fill the target, so
            # that the engine is soon seen full with requests waiting (which is how its
            # batch is learned), and a newcomer still goes: while the engine's own queue
            # (beyond fairq's jobs) is under the target and fairq's jobs without a first
            # token under twice it, it gets a place beyond the target. (Leaving newcomers
            # one place of the target instead kept the engine's queue short of what
            # learning needs: on a real vLLM with 4 slots, newcomers of the first seconds
            # waited 220-520 ms for the batch to be learned, against 60 ms once it was.)
            # Once the batch is learned, the jobs sent ahead of it are taken back for a
            # newcomer that waits (``dispatcher.stages``: carried newcomers).
            # They go at no pace: the pace follows the requests that end, and a batch that
            # only replaced those would never grow to be seen full (a 256-slot engine, paced
            # at one refill a step, never was).
            served = room
            if room == 0 and state.waiting_others < target and state.unstarted < 2 * target:
                room = 1
            limit = Limit.QUEUE_TARGET if served or not room else Limit.REFILLS_WAITING
            return _narrowed(state, room, served, limit, estimate, paced=False)
        full = config.batch(state) or batch
        kept = config.reserve(full)
        # A job sent ahead would take a kept slot rather than wait: only without them.
        ahead = config.refill_ahead if kept == 0 else 0
        free = batch + ahead - kept - state.inflight
        # Users in the engine keep the scrape's caution: a non-streamed job they sent may
        # still wait for its prefill budget, unseen until the next scrape. Where slots are
        # kept, they also leave one place of the queue target to newcomers, counted
        # lag-free: else their refills, each waiting a step for its prefill, fill the
        # target and hold a newcomer back that step although a kept slot is free. (Not
        # against the scrape's caution too: a non-streamed flood would then starve its own
        # batch between scrapes, 75% of FIFO's tokens/s on the simulator.) Within that,
        # their refills go at their pace (``dispatcher.pacing``). (The pace alone, without
        # the caution, let refills pile up in the engine at a flood's start, while the
        # engine's mean step, steps with no prefill in them included, was shorter than a
        # step with one.)
        place = 1 if kept and target > 1 else 0
        targeted = int(
            min(target - state.served_estimate, target - place - state.waiting_unstarted)
        )
        served = max(0, min(room, targeted, free))
        limit = Limit.QUEUE_TARGET
        if room > 0 and served == 0:
            limit = Limit.BATCH_SLOTS if free <= 0 else Limit.REFILLS_WAITING
        return _narrowed(state, room, served, limit, estimate)


def _narrowed(
    state: EndpointState,
    room: int,
    served: int,
    limit: Limit,
    estimate: float,
    *,
    paced: bool = True,
) -> Decision:
    """The decision with the room for users already in the engine narrowed by their pace
    (``dispatcher.pacing``; ``paced`` False: not, while the batch grows to a capacity not
    learned yet) and by a newcomer's step (``dispatcher.newcomer_step``)."""
    allowed = state.pace_allowed if paced else None  # None: not paced, or no pace known yet
    if allowed is not None and served > allowed:
        served = allowed
        limit = Limit.REFILL_PACE if allowed == 0 else limit
    if state.newcomer_step and served > 0:
        served, limit = 0, Limit.NEWCOMER_STEP
    return Decision(state.endpoint, room, limit, estimate, state.running, served)


def batch_queue(state: EndpointState, batch: int, target: int) -> float:
    """The engine's queue ahead of a newcomer when its batch is known, lag-free: fairq's
    jobs beyond the batch wait (fairq is the engine's client), and a job without its first
    token may still wait for its prefill, beyond the refills the end rate keeps starting
    (those are taken into the newcomer's step, not ahead of it). Not fairq's sends since
    the last scrape: a non-streamed job sent since would hold the newcomer back until the
    next scrape although it went into a free slot, where it waits for prefill budget a
    step or two at most (users already in the engine are still bounded by the scrape's
    estimate, so at most ``target`` of theirs wait). What the engine last reported waiting
    counts only beyond fairq's jobs there (``waiting_others``) and the target: more than
    fairq can have put there shows a batch configured larger than the engine's."""
    waiting = state.waiting_others if state.waiting_others > target else 0.0
    return float(max(state.inflight - batch, state.waiting_unstarted, waiting, 0))


ADMISSION: dict[str, AdmissionPolicy] = {p.name: p for p in (MetricsAdmission(), StaticCap())}


def choose_endpoint(
    policy: AdmissionPolicy, states: Sequence[EndpointState], band: str, config: AdmissionConfig
) -> Decision | None:
    """The endpoint with the most room for users already in the engine, then the most room,
    the least estimated queue, the least running, first listed. None when no endpoint has
    room."""
    decisions = [policy.decide(s, band, config) for s in states]
    open_ = [d for d in decisions if d.room > 0]
    if not open_:
        return None
    return min(open_, key=lambda d: (-d.room_for_served, -d.room, d.queue_estimate, d.running))


def held_by_unseen(state: EndpointState, band: str, config: AdmissionConfig) -> bool:
    """True when only fairq's jobs that the last scrape did not show keep ``band`` out of
    this endpoint: a newer scrape may show that they have left the engine's queue. Not
    when what the engine reported waiting, or the lag-free count, holds it on its own:
    then a newer scrape would change nothing until a job starts (which wakes the
    dispatcher anyway)."""
    if not (state.healthy and state.fresh) or state.unseen_now == 0:
        return False
    target = config.targets[band]
    return target - state.queue_estimate < 1 <= target - max(state.waiting_beyond, state.unstarted)


def plan_grant(
    policy: AdmissionPolicy,
    states: Sequence[EndpointState],
    bands: Sequence[str],
    config: AdmissionConfig,
) -> Grant | None:
    """Express credits: the endpoint that the most urgent band with room would be sent to,
    and how many jobs of each band it may take now. None when no band has room anywhere.

    One endpoint for every band, because an express send uses room in its one engine
    queue whatever its band; enqueue.lua takes one credit from every band per send. The
    grant's ``served`` credits bound the sends of users who already have a job in the
    engine (the batch rule), across bands.
    """
    for band in bands:
        decision = choose_endpoint(policy, states, band, config)
        if decision is None:
            continue
        state = next(s for s in states if s.endpoint == decision.endpoint)
        decisions = [policy.decide(state, b, config) for b in bands]
        credits = {b: d.room for b, d in zip(bands, decisions, strict=True) if d.room > 0}
        served = [d.served_room for d in decisions if d.served_room is not None]
        return Grant(decision.endpoint, credits, max(served) if served else None)
    return None


def refusals(
    policy: AdmissionPolicy, states: Sequence[EndpointState], band: str, config: AdmissionConfig
) -> Mapping[str, Limit]:
    """Why each full endpoint takes nothing now (for metrics and status)."""
    decisions = (policy.decide(s, band, config) for s in states)
    return {d.endpoint: d.limit for d in decisions if d.room == 0}
