"""Result streams: the entries a worker writes and the one reader per process that follows them.

A job's result stream ``fq:{m}:out:{id}`` holds, in order:

    {d: <SSE events>}      one or more ``data: {...}\\n\\n`` events, bytes as the engine sent
                           (but for token ids the worker asked for itself: taken out)
        [t: <token ids>]     a job whose answer may be resumed (workers.resume_exact): the
        [pt: <token ids>]    ids of its events' tokens, of its prompt (the first entry), and
        [td: <count>]        how many earlier token groups a resumed attempt generated again
    {b: <JSON body>}       the whole response of a non-streamed request
    {ok: ''}               the engine accepted the streamed request (``start.lua``): no
                           output, but its client's response headers may go out now
    {pk: 1}                a fence: the job was taken back out of the engine (``park.lua``)
    {end: <state>, e: <error JSON or ''>}   exactly one, last (written by complete/cancel.lua)

``ResultReader`` multiplexes every stream that a process follows over a single
blocking ``XREAD`` on one connection. Its cost per read must not grow with the
streams followed, as the read repeats every time any stream has news: the
command is kept packed (one RESP segment per key and per position, re-encoded
only for the streams that moved) and goes over a lean connection of its own
(``broker.redis.resp``), whose reply is taken as Redis sent it, without redis-py's
per-entry dict building or its coroutines per reply. A new follower must join a read that is
already blocked. Every read also names the reader's own *bell* stream, after the
last bell entry it saw: a new follower adds an entry to it (``XADD``, at most one
pending per read), and the read returns and is issued again with the new key.
Whether Redis handles the ``XADD`` before the read or while it blocks, the read
sees the entry, so no retry or poll is needed. Redis connections per process stay
at two whatever the number of concurrent streams. One stream may have several
followers (a client that reconnected while its first connection is not yet
seen to be gone): the read starts at the earliest of their positions and each
gets only the entries after its own.

Entry ids are what SSE event ids are made of (``gateway.sse``): the acceptance
mark, if written, is ``0-1``, output entries are ``0-2``, ``0-3``, ... (an attempt after
the job's g-th preemption writes ``g-1``, ``g-2``, ... after the fence ``g-0``:
``park.lua``) and the end entry's id is time-based, larger than all of them.
``read_after`` serves a client that resumes a job that has ended already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker import keys
from broker.jobs import JobState
from broker.process.backoff import Backoff
from broker.process.mailbox import Mailbox
from broker.process.tasks import stop_task
from broker.redis import replies
from broker.redis.options import READ_MARGIN_S
from broker.redis.resp import RespLink, bulk, pack

log = logging.getLogger(__name__)


CHUNK_FIELD = b"d"
BODY_FIELD = b"b"
TOKENS_FIELD = b"t"  # after d: comma-separated ids per event, ';' between events
PROMPT_TOKENS_FIELD = b"pt"  # comma-separated
REDONE_FIELD = b"td"
ACCEPTED_FIELD = b"ok"
_END_FIELD = b"end"
_ERROR_FIELD = b"e"
# The sequence of an attempt's first output entry (``<generation>-2``): ``-0`` is the
# fence of a take-back, ``-1`` the acceptance mark.
FIRST_OUTPUT_SEQ = 2


class ResultEvent(NamedTuple):
    """One entry of a result stream (a named tuple: one is made per streamed token, and a
    tuple is built in C where a frozen dataclass sets each field through Python)."""

    id: bytes
    chunk: bytes | None = None
    body: bytes | None = None
    end: JobState | None = None
    error: dict[str, object] | None = None
    accepted: bool = False  # the acceptance mark: no output, the headers may go out

    @classmethod
    def parse(cls, entry_id: bytes, fields: dict[bytes, bytes]) -> ResultEvent:
        end = fields.get(_END_FIELD)
        if end is None:
            if ACCEPTED_FIELD in fields:
                return cls(entry_id, accepted=True)
            return cls(entry_id, chunk=fields.get(CHUNK_FIELD), body=fields.get(BODY_FIELD))
        error = fields.get(_ERROR_FIELD)
        return cls(
            entry_id, end=JobState(end.decode()), error=orjson.loads(error) if error else None
        )

    @classmethod
    def from_reply(cls, entry_id: bytes, flat: list[bytes]) -> ResultEvent:
        """From an entry's fields as Redis sends them (``[name, value, ...]``)."""
        if flat and flat[0] == CHUNK_FIELD:  # the hot path: a chunk (token ids may follow it)
            return cls(entry_id, chunk=flat[1])
        return cls.parse(entry_id, dict(zip(flat[::2], flat[1::2], strict=True)))


@dataclass(slots=True)
class _Follower:
    mailbox: Mailbox[ResultEvent]
    last_id: bytes
    # The reads issued before it joined. Their replies start wherever the stream's other
    # (or former) followers were, maybe past this one's position: taken, they would skip
    # the entries in between, so it takes entries only from later reads.
    joined_after: int


def _said(exc: BaseException) -> str:
    """An error's type and message for a log line (redis-py 8's ``repr`` drops the message)."""
    return f"{type(exc).__name__}: {exc}"


def _deliver(deliveries: list[tuple[Mailbox[ResultEvent], ResultEvent]]) -> None:
    for mailbox, event in deliveries:
        mailbox.put_nowait(event)


def entry_order(entry_id: bytes) -> tuple[int, int]:
    """A stream entry id as a sortable pair (``b"0-12"`` -> (0, 12))."""
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)


async def read_after(redis: Redis, model: str, job_id: str, after: bytes) -> list[ResultEvent]:
    """The job's result entries after ``after`` (exclusive), as they are now."""
    key = keys.results(model, job_id)
    entries = await redis.xrange(key, b"(" + after if after != b"0-0" else b"-", b"+")
    return [ResultEvent.parse(entry_id, fields) for entry_id, fields in replies.entries(entries)]


class ResultReader:
    """Follows many result streams with one blocking XREAD loop (start once per process)."""

    def __init__(
        self,
        blocking: RespLink,
        control: Redis,
        bell: str,
        block_ms: int = 2000,
        count: int = 512,
        *,
        ring_link: RespLink | None = None,
    ) -> None:
        self._blocking = (
            blocking  # its own lean connection (``broker.redis.resp``): the blocking read
        )
        self._control = control  # shared pool: rings the bell, nothing else
        # The process's shared lean connection, if it has one: a bell per new stream is a
        # call per request, cheaper there than through redis-py.
        self._ring_link = ring_link
        self._bell = bell.encode()
        self._ring_command = pack(b"XADD", self._bell, b"MAXLEN", b"~", b"16", b"*", b"r", b"")
        self._bell_arg = bulk(self._bell)
        self._bell_seen = bulk(b"0-0")  # the last bell entry read (packed)
        self._rung = False  # a bell entry is on its way for the read in flight
        self._block_ms = block_ms
        # The connection has no socket time-out: each read, its connection set-up included,
        # is bounded by the block and a margin.
        self._read_bound_s = block_ms / 1000 + READ_MARGIN_S
        self._count = count
        self._followers: dict[bytes, list[_Follower]] = {}
        self._issued = 0  # reads issued so far
        # The XREAD's arguments, packed: per stream its key and the position to read after.
        self._key_args: dict[bytes, bytes] = {}
        self._id_args: dict[bytes, bytes] = {}
        self._head = b"".join(
            bulk(a)
            for a in (b"XREAD", b"COUNT", b"%d" % count, b"BLOCK", b"%d" % block_ms, b"STREAMS")
        )
        self._reading = False  # a read is in flight (sent, its reply not yet taken)
        self._changed = asyncio.Event()
        self._ringing: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="result-reader")

    async def close(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        with contextlib.suppress(RedisError):
            await self._control.delete(self._bell)
        self._blocking.close()

    @contextlib.asynccontextmanager
    async def follow(
        self, model: str, job_id: str, after: bytes = b"0-0"
    ) -> AsyncIterator[Mailbox[ResultEvent]]:
        """Follow one job's results from entry ``after`` on; yields the mailbox they arrive in."""
        key = keys.results(model, job_id).encode()
        follower = _Follower(Mailbox(), after, self._issued)
        self._followers.setdefault(key, []).append(follower)
        self._moved(key)
        # The caller need not wait for the reader to take the key in: events are read
        # from ``after`` on whenever that happens, so none can be missed.
        self._wake()
        try:
            yield follower.mailbox
        finally:
            followers = self._followers[key]
            followers.remove(follower)
            if not followers:
                del self._followers[key]
            self._moved(key)

    async def events(
        self, model: str, job_id: str, after: bytes = b"0-0"
    ) -> AsyncIterator[ResultEvent]:
        """Every event of the job up to and including its end event."""
        async with self.follow(model, job_id, after) as mailbox:
            while True:
                event = await mailbox.get()
                yield event
                if event.end is not None:
                    return

    def _wake(self) -> None:
        """Make the reader issue its read again, with every key followed now."""
        self._changed.set()  # the reader waits on this while it follows nothing
        if self._rung or not self._reading:
            return  # a bell entry is on its way, or no read is in flight: the next has it
        self._rung = True
        task = asyncio.create_task(self._ring())
        self._ringing.add(task)
        task.add_done_callback(self._ringing.discard)

    async def _ring(self) -> None:
        backoff = Backoff()
        while self._rung:  # cleared once a new read is issued: that read has the key
            try:
                await self._ring_once()
                return
            except RedisError as exc:
                log.warning(
                    "result reader bell failed (%s); retry in %.2fs", _said(exc), backoff.delay_s
                )
                await backoff.wait()

    async def _ring_once(self) -> None:
        if self._ring_link is None:
            await self._control.xadd(self._bell, {b"r": b""}, maxlen=16, approximate=True)
            return
        [reply] = await self._ring_link.round_trip(self._ring_command, 1)
        if isinstance(reply, Exception):
            raise reply

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        while True:
            if not self._followers:
                self._reading = False
                await self._changed.wait()
            self._changed.clear()
            try:
                # The events are handed over in a callback: the next read goes out first,
                # and Redis serves it while this process hands them over (a mailbox's
                # handler may write each to its client, the bulk of the work). Callbacks
                # run in the order they were scheduled: a read's events go before the next's.
                loop.call_soon(_deliver, await self._read_once())
                backoff.reset()
            except Exception as exc:  # the reader must outlive any error: every stream waits on it
                log.warning(
                    "result reader failed (%s); retrying in %.2fs", _said(exc), backoff.delay_s
                )
                self._reading = False
                await backoff.wait()

    def _moved(self, key: bytes) -> None:
        """Re-pack ``key``'s position: the earliest of its followers', or drop it."""
        followers = self._followers.get(key)
        if not followers:
            self._key_args.pop(key, None)
            self._id_args.pop(key, None)
            return
        if len(followers) == 1:
            after = followers[0].last_id
        else:
            after = min((f.last_id for f in followers), key=entry_order)
        if key not in self._key_args:
            self._key_args[key] = bulk(key)
        self._id_args[key] = bulk(after)

    def _command(self) -> bytes:
        n = len(self._key_args) + 1  # and the bell
        # Both dicts hold the same keys in the same order (added and removed together).
        return b"".join(
            (
                b"*%d\r\n" % (6 + 2 * n),
                self._head,
                *self._key_args.values(),
                self._bell_arg,
                *self._id_args.values(),
                self._bell_seen,
            )
        )

    async def _xread(self) -> list[Any]:
        """One blocking XREAD of every followed stream; the reply as Redis sent it."""
        self._reading = True
        self._rung = False  # this read names every key followed now
        self._issued += 1  # its command names every follower that joined before now
        try:
            [reply] = await self._blocking.round_trip(self._command(), 1, self._read_bound_s)
        except RedisTimeoutError:
            raise self._no_reply() from None
        finally:
            self._reading = False
        if isinstance(reply, Exception):
            raise reply
        return reply or []

    def _no_reply(self) -> RedisTimeoutError:
        return RedisTimeoutError(
            f"Redis did not answer the result reader within {self._read_bound_s:.1f} s"
        )

    async def _read_once(self) -> list[tuple[Mailbox[ResultEvent], ResultEvent]]:
        """One read: the followers' positions move on; returns the events to hand over."""
        deliveries: list[tuple[Mailbox[ResultEvent], ResultEvent]] = []
        if not self._key_args:  # the last follower left since the loop looked
            return deliveries
        replies = await self._xread()
        read = self._issued  # this read's number: only this loop issues reads
        for key, entries in replies:
            if key == self._bell:
                self._bell_seen = bulk(entries[-1][0])
                continue
            followers = self._followers.get(key)
            if not followers:
                continue
            if len(followers) == 1 and followers[0].joined_after < read:  # the usual case
                follower = followers[0]
                mailbox = follower.mailbox
                deliveries += [(mailbox, ResultEvent.from_reply(i, f)) for i, f in entries]
                follower.last_id = entries[-1][0]
            else:  # a follower joined since the read went out: the next read is its own
                for entry_id, fields in entries:
                    event, order = ResultEvent.from_reply(entry_id, fields), entry_order(entry_id)
                    for follower in followers:
                        if follower.joined_after < read and order > entry_order(follower.last_id):
                            follower.last_id = entry_id
                            deliveries.append((follower.mailbox, event))
            self._moved(key)
        return deliveries
