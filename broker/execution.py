"""The worker's view of Redis: claim dispatched jobs, write results, end jobs.

A worker reads ready-stream entries through the consumer group (each carries
the job's payload, so the engine call can begin at once), records that it
runs the job with ``start.lua`` (or drops it when the job ended meanwhile),
writes result chunks with plain pipelined ``XADD``s and
ends the job with ``complete.lua``, which also acknowledges the entry: an
entry is acknowledged only once its job is terminal.

Who owns a job while it is at the workers (the hand-over, one script each):

    dispatched  the ready stream: an entry no worker has read yet (dispatch.lua)
    read        the worker whose consumer-group pending list holds the entry
                (XREADGROUP); ``start.lua`` marks the job running under it
    running     that worker, under a lease: the entry's idle time in the group. The
                worker renews all its entries every ``lease_renew_ms`` (``renew.lua``,
                one call per model); an entry idle for ``lease_ms`` belongs to a dead
                worker, and another worker takes it over (``reclaim.lua``, XAUTOCLAIM),
                which retries the job if no output was written and it has attempts
                left, or ends it failed: after output (a retry would repeat text), or
                as a dead letter (it was started ``job_max_attempts`` times)
    terminal    nobody: ``complete.lua`` (or ``cancel.lua``, ``expire.lua``) sets it
                exactly once; ``complete.lua`` refuses a worker that lost its lease

A worker that learns from ``renew.lua`` that it lost an entry drops that job and
writes nothing more for it. The one window left: a worker paused for longer than
the lease resumes and flushes chunks before its next renewal; result entries
have fixed ids (``0-n``), so Redis refuses those that the new owner wrote
already, and the lease should be far longer than any pause (``lease_ms``).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from broker import keys, replies
from broker.dispatching import HANDED_KEEP_MS, ensure_ready_group
from broker.jobs import JobState, RequestKind
from broker.packed import PackedPipeline
from broker.resp import RespLink
from broker.results import (
    BODY_FIELD,
    CHUNK_FIELD,
    PROMPT_TOKENS_FIELD,
    REDONE_FIELD,
    TOKENS_FIELD,
)
from broker.scripts import Scripts, run_script, source
from broker.settings import Settings

log = logging.getLogger(__name__)

# What the result writer builds one flush in: the same calls on either
# (``xadd``, ``evalsha``, ``len``, ``execute(raise_on_error=False)``).
ResultPipeline = PackedPipeline | Pipeline


@dataclass(frozen=True)
class Claimed:
    """A ready-stream entry this worker now holds: everything needed to call the engine."""

    model: str
    entry_id: bytes
    job_id: str
    payload: bytes
    kind: RequestKind
    stream_flag: str  # "0", "1", or "2" (streamed and the client wants the usage chunk)
    endpoint: str
    band: str
    user: str
    engine_priority: int | None = None  # for engines scheduling by priority (vLLM)
    worker: str = ""  # the consumer holding the entry; complete.lua checks it still does
    # Taken back out of the engine mid-answer (park.lua): the generation g of this attempt's
    # result entry ids (it writes g-1, g-2...: park.lua fenced everything before with g-0);
    # it goes on from what its result stream holds. None: a fresh start (generation 0).
    resume_gen: int | None = None
    # Record the answer's token ids with its chunks ('tk': it may be resumed where it is cut).
    track_tokens: bool = False

    @classmethod
    def from_entry(
        cls, model: str, entry_id: bytes, fields: dict[bytes, bytes], worker: str = ""
    ) -> Claimed:
        return cls(
            model, entry_id, fields[b"j"].decode(), fields[b"p"],
            RequestKind(fields[b"k"].decode()), fields[b"s"].decode(), fields[b"ep"].decode(),
            fields[b"b"].decode(), fields[b"u"].decode(),
            int(fields[b"pr"]) if fields.get(b"pr") else None, worker,
            int(fields[b"rq"]) if fields.get(b"rq") else None, bool(fields.get(b"tk")),
        )  # fmt: skip

    @property
    def stream(self) -> bool:
        return self.stream_flag != "0"


class TokenTrail(NamedTuple):
    """The token ids recorded with one chunk entry (``broker.results``)."""

    tokens: bytes = b""  # the ids of its events' tokens: "1,2;3" (one group per event)
    prompt_tokens: bytes = b""  # the prompt's, with the answer's first entry: "1,2,3"
    redone: int = 0  # earlier token groups a resumed attempt generated again


class WrittenEntry(NamedTuple):
    """One chunk entry an earlier attempt wrote, with the token ids it recorded."""

    chunk: bytes
    trail: TokenTrail = TokenTrail()


@dataclass
class Outcome:
    """How a job ended at the worker; written by ``complete.lua``."""

    state: JobState
    error: dict[str, object] | None = None
    usage: dict[str, int] | None = None
    finish_reason: str | None = None
    first_token_ms: int | None = None
    extra: dict[str, object] = field(default_factory=dict)
    dead_letter: bool = False  # recorded in the model's dead-letter index


class Reclaim(enum.StrEnum):
    """What ``reclaim.lua`` decided for a job taken over from a dead worker."""

    RETRY = "retry"  # no output yet, attempts left: run it again
    FAIL = "fail"  # output was written: end it failed (a retry would repeat text)
    DEAD = "dead"  # started job_max_attempts times: end it as a dead letter


@dataclass(frozen=True)
class Reclaimed:
    decision: Reclaim
    attempts: int  # times the job was started so far
    job: Claimed


class ExecutionStore:
    def __init__(self, redis: Redis, settings: Settings, results: RespLink | None = None) -> None:
        """``results``: the lean connection the result writer's pipelines and ``start``
        use (see ``pipeline``); without it they are redis-py's."""
        self._redis = redis
        self._results = results
        self._settings = settings
        self._scripts = Scripts.bind(redis)
        self._renew = redis.register_script(source("renew"))
        self._reclaim = redis.register_script(source("reclaim"))
        self._expire = redis.register_script(source("expire"))
        self._forget = redis.register_script(source("forget"))

    async def ensure_groups(self, models: Sequence[str]) -> None:
        for model in models:
            await ensure_ready_group(self._redis, model)

    async def claim(
        self,
        blocking: Redis,
        models: Sequence[str],
        consumer: str,
        count: int,
        block_ms: int,
        *,
        history: bool = False,
    ) -> list[Claimed]:
        """Read up to ``count`` new ready entries for this consumer, blocking up to
        ``block_ms``; with ``history``, the entries it holds already (its pending list:
        those it runs, and any whose delivery it never saw), without blocking."""
        streams: dict[KeyT, StreamIdT] = {keys.ready(m): "0" if history else ">" for m in models}
        reply = await blocking.xreadgroup(
            keys.READY_GROUP,
            consumer,
            streams,
            count=count,
            block=None if history else block_ms,
        )
        by_key = {keys.ready(m).encode(): m for m in models}
        claimed, malformed = [], []
        for stream, entries in replies.deliveries(reply or []):
            for entry_id, fields in entries:
                if not fields:  # an entry deleted meanwhile comes back without fields
                    continue
                job = _parsed(by_key[stream], entry_id, fields, consumer)
                if job is None:
                    malformed.append((by_key[stream], entry_id))
                else:
                    claimed.append(job)
        if malformed:
            await self._remove_entries(malformed)
        return claimed

    async def _remove_entries(self, entries: Sequence[tuple[str, bytes]]) -> None:
        """Acknowledge and delete ready entries that can never run (see ``_parsed``), so
        that no worker reads them again after a lease lapses."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for model, entry_id in entries:
                pipe.xack(keys.ready(model), keys.READY_GROUP, entry_id)
                pipe.xdel(keys.ready(model), entry_id)
            await pipe.execute()

    async def start(self, claimed: Claimed, worker: str) -> int | None:
        """Record that ``worker`` runs the job; its attempt number, or None (and acked)
        when the job ended meanwhile and must be dropped."""
        keys_ = [
            keys.job(claimed.model, claimed.job_id),
            keys.transit(claimed.model),
            keys.handed(claimed.model),
        ]
        args: list[str | int] = [worker, claimed.job_id, HANDED_KEEP_MS]
        # Every job runs it: on the lean connection, when there is one.
        reply = await run_script(self._scripts.start, keys_, args, self._results)
        if reply[0] == 1:
            return int(reply[1])
        await self._redis.xack(keys.ready(claimed.model), keys.READY_GROUP, claimed.entry_id)
        return None

    # Result entries get explicit ids 0-1, 0-2, ... per job (g-1, g-2, ... for an attempt
    # of generation g: ``Claimed.resume_gen``). A write retried after a failure whose fate
    # is unknown is then refused by Redis as "equal or smaller" instead of landing twice,
    # so a client never receives the same chunk twice.
    # The end entry gets a time-based id, so nothing can be added after it either.
    @staticmethod
    def add_chunk(
        pipe: ResultPipeline,
        model: str,
        job_id: str,
        entry_id: bytes,
        data: bytes,
        *,
        trail: TokenTrail | None = None,
    ) -> None:
        """``trail``: the token ids that go with the chunk."""
        # bytes to bytes, which both pipelines take (redis-py's is typed wider, so Any)
        fields: dict[Any, Any] = {CHUNK_FIELD: data}
        if trail is not None:
            _add_trail(fields, trail)
        pipe.xadd(keys.results(model, job_id), fields, id=entry_id)

    @staticmethod
    def add_body(
        pipe: ResultPipeline, model: str, job_id: str, entry_id: bytes, body: bytes
    ) -> None:
        pipe.xadd(keys.results(model, job_id), {BODY_FIELD: body}, id=entry_id)

    @staticmethod
    def entry_id(job: Claimed, n: int) -> bytes:
        """The id of the ``n``-th result entry (from 1) the job's attempt writes."""
        return b"%d-%d" % (job.resume_gen or 0, n)

    async def written(self, job: Claimed) -> list[WrittenEntry]:
        """The chunk entries earlier attempts of a resumed job wrote (``resume_gen``): what
        its client has received, up to the fence ``park.lua`` added, with their token ids."""
        fence = self.entry_id(job, 0)
        entries = await self._redis.xrange(keys.results(job.model, job.job_id), "-", fence)
        return [
            WrittenEntry(fields[CHUNK_FIELD], _trail(fields))
            for _, fields in replies.entries(entries)
            if CHUNK_FIELD in fields
        ]  # fmt: skip

    @staticmethod
    def is_duplicate_write(error: Exception) -> bool:
        """True for the error of a result entry that is already there (or after the end)."""
        return isinstance(error, ResponseError) and "equal or smaller" in str(error)

    def add_complete(self, pipe: ResultPipeline, job: Claimed, outcome: Outcome) -> None:
        """Queue ``complete.lua`` by SHA (``load_scripts``); its reply is 1 if it ended the job."""
        model, config = job.model, self._settings.model(job.model)
        prompt_cost = config.prompt_token_cost if config else 1.0
        output_cost = config.output_token_cost if config else 1.0
        pipe.evalsha(
            self._scripts.complete.sha, 9,
            keys.job(model, job.job_id), keys.results(model, job.job_id),
            keys.ready(model), keys.inflight(model), keys.unstarted(model),
            keys.backlog(model, job.band), keys.user_counts(model), keys.dead_letters(model),
            keys.transit(model),
            outcome.state.value, keys.READY_GROUP, self._settings.result_ttl_s,
            keys.wake_channel(model), _json(outcome.error), _json(outcome.usage),
            outcome.finish_reason or "", outcome.first_token_ms or "",
            prompt_cost, output_cost, job.user, job.worker,
            job.job_id if outcome.dead_letter else "",
        )  # fmt: skip

    def add_first(self, pipe: ResultPipeline, model: str, job_id: str) -> None:
        """Queue ``first.lua``: the job's first output is written (it has started)."""
        pipe.evalsha(
            self._scripts.first.sha, 2,
            keys.job(model, job_id), keys.unstarted(model), keys.wake_channel(model),
        )  # fmt: skip

    async def load_scripts(self) -> None:
        """Load the scripts pipelines call by SHA (at start, and after Redis lost them)."""
        for script in (self._scripts.complete, self._scripts.first):
            await self._redis.script_load(script.script)

    async def renew(self, worker: str, held: Mapping[str, Sequence[bytes]]) -> set[bytes]:
        """Renew the lease on every entry ``worker`` holds (model -> entry ids), in one
        round trip; returns the entry ids it has lost (another worker owns them now)."""
        pipe = self._redis.pipeline(transaction=False)
        for model, entries in held.items():
            await self._renew(
                keys=[keys.ready(model)], args=[keys.READY_GROUP, worker, *entries], client=pipe
            )
        replies = await pipe.execute()
        return {entry for lost in replies for entry in lost}

    async def reclaim(self, model: str, worker: str, count: int) -> list[Reclaimed]:
        """Take over up to ``count`` entries whose lease lapsed; each with its fate."""
        s = self._settings
        reply = await self._reclaim(
            keys=[keys.ready(model), keys.unstarted(model), keys.transit(model)],
            args=[
                keys.READY_GROUP, worker, s.lease_ms, count, keys.job_prefix(model),
                keys.results_prefix(model), s.job_max_attempts,
            ],
        )  # fmt: skip
        out, malformed = [], []
        for decision, entry_id, attempts, flat in reply:
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            job = _parsed(model, entry_id, fields, worker)
            if job is None:
                malformed.append((model, entry_id))
            else:
                out.append(Reclaimed(Reclaim(decision.decode()), int(attempts), job))
        if malformed:
            await self._remove_entries(malformed)
        return out

    async def forget_gone_consumers(self, model: str) -> list[str]:
        """Remove the ready group's consumers idle ``forget_consumer_after_ms`` with nothing
        pending (workers that are gone); their names."""
        names = await self._forget(
            keys=[keys.ready(model)],
            args=[keys.READY_GROUP, self._settings.forget_consumer_after_ms],
        )
        return [name.decode() for name in names]

    async def expire(self, model: str, band: str, deadline_ms: int, budget: int = 500) -> list[str]:
        """End as expired the jobs of ``band`` queued longer than ``deadline_ms``."""
        expired: list[str] = []
        rank = 0
        while rank >= 0:
            reply = await self._expire(
                keys=[keys.backlog(model, band), keys.queued_counts(model), keys.meta(model)],
                args=[
                    keys.queue_prefix(model, band), keys.job_prefix(model),
                    keys.results_prefix(model), band, deadline_ms, self._settings.result_ttl_s,
                    keys.wake_channel(model), budget, rank, 200,
                    f"{keys.parked_prefix(model)}{band}:",
                ],
            )  # fmt: skip
            rank = int(reply[0])
            expired += [job_id.decode() for job_id in reply[1:]]
        return expired

    async def take_turn(self, model: str, worker: str, ttl_ms: int) -> bool:
        """True if ``worker`` may run the model's periodic sweep now (a TTL'd SET NX PX:
        one worker per model per turn; the lock simply lapses, nobody releases it)."""
        return bool(await self._redis.set(keys.sweep_lock(model), worker, nx=True, px=ttl_ms))

    async def dead_letters(self, model: str, limit: int) -> list[tuple[str, int]]:
        """The newest dead-lettered jobs of a model: (job id, when in ms)."""
        rows = await self._redis.zrevrange(keys.dead_letters(model), 0, limit - 1, withscores=True)
        return [(job_id.decode(), int(when)) for job_id, when in replies.scored(rows)]

    def pipeline(self) -> ResultPipeline:
        """A pipeline for the result writer: packed by hand on the lean connection when the
        store has one (``broker.packed``), else redis-py's (routed by slot on a cluster)."""
        if self._results is None:
            return self._redis.pipeline(transaction=False)
        return PackedPipeline(self._results)

    def cancel_channels(self, models: Sequence[str]) -> dict[str, str]:
        """Channel -> model, for the channels that announce cancelled jobs."""
        return {keys.cancel_channel(m): m for m in models}


def _parsed(model: str, entry_id: bytes, fields: dict[bytes, bytes], worker: str) -> Claimed | None:
    """The entry as a job to run; None, logged, for an entry that lacks what a job needs.

    Only fairq's scripts write ready entries, so this takes a bug or a hand-made entry.
    Raising instead would stop the worker, and every worker after it would read the
    entry again once its lease lapsed: one bad entry would stop the fleet.
    """
    try:
        return Claimed.from_entry(model, entry_id, fields, worker)
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        names = sorted(name.decode(errors="replace") for name in fields)
        log.error(
            "ready entry %s of model %s is malformed (%s: %s); it is removed, as no worker "
            "could run it (fields: %s)",
            entry_id.decode(), model, type(exc).__name__, exc, names,
        )  # fmt: skip
        return None


def _add_trail(fields: dict[Any, Any], trail: TokenTrail) -> None:
    """The token id fields of a chunk entry (``broker.results``), those that say anything."""
    if trail.tokens:
        fields[TOKENS_FIELD] = trail.tokens
    if trail.prompt_tokens:
        fields[PROMPT_TOKENS_FIELD] = trail.prompt_tokens
    if trail.redone:
        fields[REDONE_FIELD] = b"%d" % trail.redone


def _trail(fields: Mapping[bytes, bytes]) -> TokenTrail:
    return TokenTrail(
        fields.get(TOKENS_FIELD, b""), fields.get(PROMPT_TOKENS_FIELD, b""),
        int(fields.get(REDONE_FIELD) or 0),
    )  # fmt: skip


def _json(value: object | None) -> str:
    return orjson.dumps(value).decode() if value else ""
