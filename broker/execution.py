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

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from broker import job_fields as jf
from broker import keys
from broker.dispatching import HANDED_KEEP_MS, ensure_ready_group
from broker.jobs import JobState, RequestKind, StreamMode
from broker.lua import load_scripts
from broker.lua.complete import complete_call
from broker.lua.expire import expire_call
from broker.lua.first import first_call
from broker.lua.forget import forget_call
from broker.lua.reclaim import Reclaim, reclaim_call
from broker.lua.renew import renew_call
from broker.lua.reroute import Rerouted, reroute_call
from broker.lua.start import start_call
from broker.redis import replies
from broker.redis.packed import PackedPipeline
from broker.redis.resp import RespLink
from broker.results import (
    BODY_FIELD,
    CHUNK_FIELD,
    FIRST_OUTPUT_SEQ,
    PROMPT_TOKENS_FIELD,
    REDONE_FIELD,
    TOKENS_FIELD,
)
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
    stream_flag: StreamMode
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
            model,
            entry_id,
            fields[jf.JOB_ID].decode(),
            fields[jf.PAYLOAD],
            RequestKind(fields[jf.KIND].decode()),
            StreamMode(fields[jf.STREAM].decode()),
            fields[jf.ENDPOINT].decode(),
            fields[jf.BAND].decode(),
            fields[jf.USER].decode(),
            int(fields[jf.ENGINE_PRIORITY]) if fields.get(jf.ENGINE_PRIORITY) else None,
            worker,
            int(fields[jf.RESUME_FROM]) if fields.get(jf.RESUME_FROM) else None,
            bool(fields.get(jf.TOKEN_IDS)),
        )

    @property
    def stream(self) -> bool:
        """Its client reads server-sent events."""
        return self.stream_flag.to_client


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

    async def start(self, claimed: Claimed, worker: str, *, accepted: bool = False) -> int | None:
        """Record that ``worker`` runs the job (and, ``accepted``, that the engine accepted
        its streamed request: ``start.lua``); its attempt number, or None (and acked) when
        the job ended meanwhile and must be dropped."""
        call = start_call(claimed.model, claimed.job_id, worker, HANDED_KEEP_MS, accepted=accepted)
        # Every job runs it: on the lean connection, when there is one.
        attempt = await call.run(self._redis if self._results is None else self._results)
        if attempt is not None:
            return attempt
        await self._redis.xack(keys.ready(claimed.model), keys.READY_GROUP, claimed.entry_id)
        return None

    async def reroute(self, job: Claimed) -> Rerouted:
        """Hand the job back (``reroute.lua``): its engine never took it, and nothing of it
        was written; the dispatcher sends it again, within ``engine_max_reroutes``."""
        call = reroute_call(
            job.model,
            job.job_id,
            band=job.band,
            user=job.user,
            worker=job.worker,
            attempt_entry=job.entry_id,
            max_reroutes=self._settings.engine_max_reroutes,
        )
        return await call.run(self._redis)

    # Result entries get explicit ids 0-2, 0-3, ... per job (g-2, g-3, ... for an attempt
    # of generation g: ``Claimed.resume_gen``; g-1 is the acceptance mark of ``start.lua``,
    # g-0 the fence of ``park.lua``). A write retried after a failure whose fate
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
        """The id of the ``n``-th output entry (from 1) the job's attempt writes."""
        return b"%d-%d" % (job.resume_gen or 0, n + FIRST_OUTPUT_SEQ - 1)

    async def written(self, job: Claimed) -> list[WrittenEntry]:
        """The chunk entries earlier attempts of a resumed job wrote (``resume_gen``): what
        its client has received, up to the fence ``park.lua`` added, with their token ids."""
        fence = self.entry_id(job, 0)
        entries = await self._redis.xrange(keys.results(job.model, job.job_id), "-", fence)
        return [
            WrittenEntry(fields[CHUNK_FIELD], _trail(fields))
            for _, fields in replies.entries(entries)
            if CHUNK_FIELD in fields
        ]

    @staticmethod
    def is_duplicate_write(error: Exception) -> bool:
        """True for the error of a result entry that is already there (or after the end)."""
        return isinstance(error, ResponseError) and "equal or smaller" in str(error)

    def add_complete(self, pipe: ResultPipeline, job: Claimed, outcome: Outcome) -> None:
        """Queue ``complete.lua`` by SHA (``load_scripts``); its reply is 1 if it ended the job."""
        s, config = self._settings, self._settings.model(job.model)
        complete_call(
            job.model,
            job.job_id,
            band=job.band,
            user=job.user,
            worker=job.worker,
            state=outcome.state,
            ttl_s=s.result_ttl_s,
            error=_json(outcome.error),
            usage=_json(outcome.usage),
            finish_reason=outcome.finish_reason or "",
            first_token_ms=outcome.first_token_ms,
            prompt_cost=config.prompt_token_cost if config else 1.0,
            output_cost=config.output_token_cost if config else 1.0,
            dead_letter=outcome.dead_letter,
            attempt_entry=job.entry_id,
        ).queue(pipe)

    def add_first(
        self, pipe: ResultPipeline, model: str, job_id: str, first_ms: int | None = None
    ) -> None:
        """Queue ``first.lua``: the job's first output is written (it has started);
        ``first_ms``, the worker's time of that output, shows as its first-token time from
        now on (None: it reached its engine, no first token yet)."""
        first_call(model, job_id, first_ms).queue(pipe)

    async def load_scripts(self) -> None:
        """Load the scripts (at start, and after Redis lost them): pipelines call them by SHA."""
        await load_scripts(self._redis)

    async def renew(self, worker: str, held: Mapping[str, Sequence[bytes]]) -> set[bytes]:
        """Renew the lease on every entry ``worker`` holds (model -> entry ids), in one
        round trip; returns the entry ids it has lost (another worker owns them now)."""
        calls = [renew_call(model, worker, entries) for model, entries in held.items()]
        async with self._redis.pipeline(transaction=False) as pipe:
            for call in calls:
                call.queue(pipe)
            replies = await pipe.execute()
        return {entry for c, lost in zip(calls, replies, strict=True) for entry in c.decode(lost)}

    async def reclaim(self, model: str, worker: str, count: int) -> list[Reclaimed]:
        """Take over up to ``count`` entries whose lease lapsed; each with its fate."""
        s = self._settings
        call = reclaim_call(
            model, worker, lease_ms=s.lease_ms, count=count, max_attempts=s.job_max_attempts
        )
        out, malformed = [], []
        for taken in await call.run(self._redis):
            job = _parsed(model, taken.entry_id, taken.fields, worker)
            if job is None:
                malformed.append((model, taken.entry_id))
            else:
                out.append(Reclaimed(taken.decision, taken.attempts, job))
        if malformed:
            await self._remove_entries(malformed)
        return out

    async def forget_gone_consumers(self, model: str) -> list[str]:
        """Remove the ready group's consumers idle ``forget_consumer_after_ms`` with nothing
        pending (workers that are gone); their names."""
        idle_ms = self._settings.forget_consumer_after_ms
        return await forget_call(model, idle_ms).run(self._redis)

    async def expire(
        self, model: str, band: str, deadline_ms: int | None, budget: int = 500
    ) -> list[str]:
        """End as expired the jobs of ``band`` queued longer than ``deadline_ms`` (None: the
        band has no deadline), or than their own deadline (``broker.deadlines``)."""
        expired: list[str] = []
        rank = 0
        while rank >= 0:
            call = expire_call(
                model,
                band,
                deadline_ms=deadline_ms,
                ttl_s=self._settings.result_ttl_s,
                budget=budget,
                rank=rank,
                users=200,
            )
            rank, job_ids = await call.run(self._redis)
            expired += job_ids
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
        store has one (``broker.redis.packed``), else redis-py's (routed by slot on a cluster)."""
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
            entry_id.decode(),
            model,
            type(exc).__name__,
            exc,
            names,
        )
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
