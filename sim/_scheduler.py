"""vLLM's continuous-batching scheduler, reduced to token counts and KV blocks.

Pure: no asyncio and no clock, so every decision is testable on hand-made
states. The engine loop (`_engine.py`) calls `schedule()`, sleeps for the
plan's simulated duration, then `complete(plan)`, and turns the result into
tokens, metrics and wake-ups.

One step, as vLLM's V1 scheduler (chunked prefill always on):

1. Running requests in admission order: every decode takes 1 token of the
   `max_num_batched_tokens` budget; then running requests still prefilling (a
   long prompt, or a recompute after preemption) take what is left, in order.
   (vLLM walks its running list once; decodes first differs only when an older
   request is still prefilling, and then keeps its decodes from stalling.)
2. A request that needs a new KV block when none is free preempts a running
   request (recompute mode): FCFS takes the most recently admitted one, the
   priority policy the worst (priority, arrival). The victim drops its blocks
   and computed tokens and goes back to the front of the waiting queue; it must
   prefill prompt + generated tokens again, but never re-emits a token.
3. Only if nothing was preempted: waiting requests are admitted in queue order
   while a slot (`max_num_seqs`), budget and KV room remain; a prompt longer
   than the budget is prefilled in chunks over several steps. The priority
   policy orders the waiting queue only: a better-priority request waits for
   the next free slot like any other, ahead of worse ones, and never preempts
   a running request for a slot (vLLM 0.32's `Scheduler.schedule` in
   `vllm/v1/core/sched/scheduler.py` stops admitting when the batch is full,
   whatever the priority; measured the same on its CPU build).

A request emits a token only in the step that computes its last outstanding
token, so a chunked prompt's first token comes with its last chunk.

Prefix caching (``_prefix``): a request admitted from the waiting queue (new, or
preempted and so computed from scratch) starts with its longest run of cached
leading prompt blocks already computed, so only the rest counts as prefill in the
step's budget and time. Its blocks are cached as they are computed, and refreshed
when it ends. (It still holds its own KV blocks for the cached part: vLLM shares
them, which matters only to an engine short of KV room.)
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sim._prefix import PrefixCache
from sim._profile import SimProfile
from sim._queues import FcfsQueue, PriorityQueue, WaitingQueue


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False, slots=True, kw_only=True)
class SchedSeq:
    """A request as the scheduler sees it. Identity equality: each is its own entry."""

    prompt_tokens: int
    max_tokens: int
    priority: int = 0  # lower is served first (vLLM's convention); FCFS ignores it
    arrival: int = 0  # arrival order, set by Scheduler.add
    status: SeqStatus = SeqStatus.WAITING
    generated: int = 0  # tokens emitted to the client; never goes back
    computed: int = 0  # tokens whose KV is in the cache; 0 again after a preemption
    blocks: int = 0  # KV blocks held
    prefix_blocks: tuple[int, ...] = ()  # the prompt's full blocks' hashes (_prefix)
    cached: int = 0  # prompt tokens found in the prefix cache at its last admission

    @property
    def done(self) -> bool:
        return self.status in (SeqStatus.FINISHED, SeqStatus.ABORTED)


S = TypeVar("S", bound=SchedSeq)


@dataclass(slots=True)
class StepPlan(Generic[S]):
    """What one step computes; `scheduled` maps each request to its tokens this step."""

    budget: int  # tokens still free in this step
    scheduled: dict[S, int] = field(default_factory=dict)
    admitted: list[S] = field(default_factory=list)  # moved from waiting to running
    preempted: list[S] = field(default_factory=list)
    decode_seqs: int = 0
    prefill_tokens: int = 0
    duration_s: float = 0.0

    def add(self, seq: S, tokens: int) -> None:
        self.scheduled[seq] = tokens
        self._count(tokens, 1)

    def drop(self, seq: S) -> None:
        """Unschedule a preempted request: its tokens go back to the budget."""
        tokens = self.scheduled.pop(seq, 0)
        if tokens:
            self._count(tokens, -1)

    def _count(self, tokens: int, sign: int) -> None:
        self.budget -= sign * tokens
        # Computing one token of a sequence costs what a decode costs, whatever its phase.
        if tokens == 1:
            self.decode_seqs += sign
        else:
            self.prefill_tokens += sign * tokens


@dataclass(frozen=True, slots=True)
class StepOutput(Generic[S]):
    emitted: list[S]  # each produced exactly one new token
    finished: list[S]  # reached max_tokens this step (also in `emitted`)


class Scheduler(Generic[S]):
    """The waiting queue, the running set and the KV-block pool of one engine."""

    def __init__(self, profile: SimProfile) -> None:
        self._profile = profile
        self._by_priority = profile.scheduling_policy == "priority"
        self.waiting: WaitingQueue[S] = PriorityQueue() if self._by_priority else FcfsQueue()
        # A dict as an insertion-ordered set: admission order, O(1) removal.
        self.running: dict[S, None] = {}
        self.free_blocks = profile.num_kv_blocks
        self.prefix_cache = PrefixCache(profile.prefix_cache_blocks)
        self._arrivals = itertools.count()

    @property
    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    @property
    def used_blocks(self) -> int:
        return self._profile.num_kv_blocks - self.free_blocks

    def add(self, seq: S) -> None:
        seq.arrival = next(self._arrivals)
        seq.status = SeqStatus.WAITING
        self.waiting.add(seq)

    def abort(self, seq: S) -> bool:
        """Take a request out wherever it is; False if it had already ended."""
        if seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        elif seq.status is SeqStatus.RUNNING:
            self._release(seq)
        else:
            return False
        seq.status = SeqStatus.ABORTED
        return True

    def schedule(self) -> StepPlan[S]:
        plan: StepPlan[S] = StepPlan(budget=self._profile.max_num_batched_tokens)
        self._schedule_running(plan)
        # As vLLM: a step that had to preempt admits nothing, or it would thrash.
        if not plan.preempted:
            self._admit_waiting(plan)
        plan.duration_s = step_duration_s(self._profile, plan.decode_seqs, plan.prefill_tokens)
        return plan

    def complete(self, plan: StepPlan[S]) -> StepOutput[S]:
        """Apply a finished step: advance computed tokens, emit and finish requests."""
        emitted: list[S] = []
        finished: list[S] = []
        for seq, tokens in plan.scheduled.items():
            if seq.status is not SeqStatus.RUNNING:
                continue  # aborted while the step ran
            seq.computed += tokens
            if tokens > 1:  # a prefill chunk: its full blocks are now cached
                self._cache_computed(seq)
            if seq.computed < seq.prompt_tokens + seq.generated:
                continue  # one chunk of a longer prefill: no token yet
            seq.generated += 1
            emitted.append(seq)
            if seq.generated >= seq.max_tokens:
                # As vLLM frees a finished request's blocks: its prompt becomes the most
                # recently used, the last block first in line for eviction.
                self.prefix_cache.touch(seq.prefix_blocks)
                self._release(seq)
                seq.status = SeqStatus.FINISHED
                finished.append(seq)
        return StepOutput(emitted, finished)

    # --- one step ---------------------------------------------------------------------

    def _schedule_running(self, plan: StepPlan[S]) -> None:
        prefilling: list[S] = []
        for seq in list(self.running):  # a copy: preemption removes entries
            if plan.budget == 0:
                return
            if seq.status is not SeqStatus.RUNNING:
                continue  # preempted earlier in this step
            if seq.prompt_tokens + seq.generated - seq.computed > 1:
                prefilling.append(seq)  # after every decode has its token
            else:
                self._schedule_running_seq(seq, 1, plan)
        for seq in prefilling:
            if plan.budget == 0:
                return
            if seq.status is SeqStatus.RUNNING:
                need = seq.prompt_tokens + seq.generated - seq.computed
                self._schedule_running_seq(seq, min(need, plan.budget), plan)

    def _schedule_running_seq(self, seq: S, tokens: int, plan: StepPlan[S]) -> None:
        while not self._allocate(seq, tokens):
            victim = self._worst_running()
            self._preempt(victim, plan)
            if victim is seq:
                return
        plan.add(seq, tokens)

    def _admit_waiting(self, plan: StepPlan[S]) -> None:
        max_seqs = self._profile.max_num_seqs
        while len(self.waiting) > 0 and plan.budget > 0:
            seq = self.waiting.peek()
            if len(self.running) >= max_seqs:
                return
            seq.computed = seq.cached = self._cached_tokens(seq)
            tokens = min(seq.prompt_tokens + seq.generated - seq.computed, plan.budget)
            if not self._allocate(seq, tokens):
                seq.computed = seq.cached = 0
                return
            self._cache_computed(seq)
            self.waiting.pop()
            seq.status = SeqStatus.RUNNING
            self.running[seq] = None
            plan.admitted.append(seq)
            plan.add(seq, tokens)

    def _cached_tokens(self, seq: S) -> int:
        """The prompt tokens of ``seq`` that the prefix cache holds in a row from the start,
        less at least one token to compute: the first output token needs its logits."""
        size = self._profile.block_size
        limit = (seq.prompt_tokens + seq.generated - 1) // size
        return self.prefix_cache.hits(seq.prefix_blocks, limit) * size

    def _cache_computed(self, seq: S) -> None:
        self.prefix_cache.touch(seq.prefix_blocks[: seq.computed // self._profile.block_size])

    def _worst_running(self) -> S:
        if self._by_priority:
            return max(self.running, key=_priority_order)
        return next(reversed(self.running))  # the most recently admitted

    def _preempt(self, victim: S, plan: StepPlan[S]) -> None:
        self._release(victim)
        victim.computed = 0  # recompute mode: its KV is gone, prompt + output refill later
        victim.status = SeqStatus.WAITING
        plan.drop(victim)
        plan.preempted.append(victim)
        self.waiting.put_back(victim)

    # --- KV blocks ----------------------------------------------------------------------

    def _allocate(self, seq: S, tokens: int) -> bool:
        """Hold enough blocks for `seq` to compute `tokens` more; False if too few are free."""
        needed = -(-(seq.computed + tokens) // self._profile.block_size) - seq.blocks
        if needed <= 0:
            return True
        if needed > self.free_blocks:
            return False
        self.free_blocks -= needed
        seq.blocks += needed
        return True

    def _release(self, seq: S) -> None:
        del self.running[seq]
        self.free_blocks += seq.blocks
        seq.blocks = 0


def _priority_order(seq: SchedSeq) -> tuple[int, int]:
    return seq.priority, seq.arrival


def step_duration_s(profile: SimProfile, decode_seqs: int, prefill_tokens: int) -> float:
    """Wall time of one step: a fixed cost, a cost per decoding sequence, and prefill.

    Decode is bound by memory bandwidth (weights once per step, plus each
    sequence's KV), prefill by compute; a step that mixes both pays for both.
    Output tokens/s = decode_seqs / step time, so it rises with the batch and
    levels off towards 1 / step_per_seq_ms.
    """
    ms = (
        profile.step_base_ms
        + profile.step_per_seq_ms * decode_seqs
        + profile.prefill_ms_per_token * prefill_tokens
    )
    return ms / 1000.0
