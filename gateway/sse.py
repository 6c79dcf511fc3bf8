"""The streaming hot path: result-stream entries to Server-Sent Events, bytes as they are.

Each chunk entry already holds complete ``data: {...}\\n\\n`` events as the engine
sent them, so chunks pass through without JSON parsing, logging or Redis calls
of their own. Whatever the reader delivered since the last write goes out as one
body message, so a burst of tokens costs one ``send``. The end event adds an
error event when the job did not complete (see ``outcomes``), then ``[DONE]``.
While nothing arrives (queued, or a slow first token) a comment line at least
every ``HEARTBEAT_S`` keeps proxies from closing an idle connection. One timer
per stream, re-armed twice per period, watches for the lull: a token costs no
timer of its own.

Under uvicorn, a token that arrives while the stream's task waits idle is written
to the client by the result reader itself (the mailbox's handler, a
``body_writer``): no wake-up of the task, no ASGI ``send`` coroutine. Everything
else (the end, a heartbeat, a resumed entry's first events, a client that reads
slower than tokens come) goes through the task, and the mailbox keeps the order.

Every event carries an SSE ``id``: ``<result entry id>.<n>``, the n-th event of
that entry (``0-7.2``). A client that lost its connection sends the last id it
saw as ``Last-Event-ID`` to ``GET /v1/jobs/{id}/stream`` and gets exactly the
events after it (``resume_point``): nothing twice, nothing missing, even when
the connection broke in the middle of an entry's events. The ids cost one
split and join per entry, no parsing.

A new stream's response headers are held back until its first event that decides
the answer (``hold``): the engine's acceptance of the request (the mark ``start.lua``
writes when the engine answered 200, a step or more before the first token), output,
or the job's end. A job that ends with an error before that (the engine refused the
request, it was cancelled or expired, the gateway is stopping) then gets the status
and error object a non-streamed request gets, not a 200 with an error event that an
OpenAI client cannot tell from a broken stream. The hold lasts one lull at most
(``HEARTBEAT_S`` of nothing): then the 200 goes out with a keep-alive comment, and a
later error is an event as before, so no silence on the connection is longer than the
heartbeat's, held or not. Headers sent at the acceptance leave the client time to
handle them (httpx builds its ``Response``, the openai client its ``Stream``) while
the engine computes the first token; where no mark came (a retried engine call, output
that landed first), the headers and the first token leave together: the first token
wakes the stream's task, which sends both (a token that finds the task idle is
otherwise written by the reader itself), one wake-up per stream. The client leaving
while its headers wait cancels the job as before. A resumed stream (``Last-Event-ID``)
is not held: its client had its 200, and output, before.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping

import orjson
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from broker.errors import InvalidRequest
from broker.process.mailbox import Mailbox
from broker.results import ResultEvent
from gateway.body_writer import BodyWriter, body_writer
from gateway.errors import JOB_HEADER, REPLAYED_HEADER, error_response
from gateway.followed import FollowedJob
from gateway.outcomes import SHUTDOWN, ended_error

HEARTBEAT_S = 15.0
# The scope key of the server's own ``send`` (``app._GatewayApp``), for the body messages.
SERVER_SEND = "fairq.server_send"
_KEEPALIVE = b": keep-alive\n\n"
_DONE = b"data: [DONE]\n\n"
_LULL = ResultEvent(b"lull")  # put in a mailbox by _Heartbeat: nothing came for a while
_GONE = ResultEvent(b"gone")  # put in a mailbox by _watch_disconnect: the client left
_EVENT_ID = re.compile(r"^(\d{1,20}-\d{1,20})(?:\.(\d{1,9}))?$")


def resume_point(last_event_id: str | None) -> tuple[bytes, int]:
    """The result entry to resume from and how many of its events the client has seen.

    ``None`` (a first connection) gives (``0-0``, 0): everything.
    """
    if not last_event_id:
        return b"0-0", 0
    match = _EVENT_ID.match(last_event_id.strip())
    if match is None:
        raise InvalidRequest(
            f"Last-Event-ID {last_event_id[:40]!r} is not an event id of this stream "
            "(expected the id of the last event received, like '0-7.2')"
        )
    entry, index = match.groups()
    return entry.encode(), 0 if index is None else int(index) + 1


def _with_ids(entry_id: bytes, events: bytes, skip: int = 0) -> bytes:
    """The entry's events, each with its id; the first ``skip`` left out (seen already)."""
    if not skip and events.count(b"\n\n") == 1:  # the usual entry: one token's event
        return b"id: %s.0\n%s" % (entry_id, events)
    parts = events.split(b"\n\n")
    parts.pop()  # what follows the last event's blank line: nothing
    prefix = b"id: " + entry_id + b"."
    return b"".join([prefix + b"%d\n" % i + e + b"\n\n" for i, e in enumerate(parts) if i >= skip])


class _Heartbeat:
    """Puts ``_LULL`` in a stream's mailbox when no event arrived for half a period twice."""

    def __init__(self, events: Mailbox[ResultEvent]) -> None:
        self.batches = 0  # counted by the stream as it takes or writes events
        self._seen = -1
        self._events = events
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(HEARTBEAT_S / 2, self._tick)

    def _tick(self) -> None:
        if self.batches == self._seen and self._events.empty():
            self._events.put_nowait(_LULL)
        self._seen = self.batches
        self._handle = self._loop.call_later(HEARTBEAT_S / 2, self._tick)

    def cancel(self) -> None:
        self._handle.cancel()


def _to_send(batch: list[ResultEvent]) -> list[ResultEvent] | None:
    """Of the events that have arrived, those to send: up to the first that ends the
    stream; None on a lull."""
    if batch[0] is _LULL:  # put only into an empty mailbox: first if at all
        del batch[0]
        if not batch:
            return None
    for index, event in enumerate(batch):
        if event.end is not None or event is SHUTDOWN or event is _GONE:
            return batch[: index + 1]  # nothing after it is sent
    return batch


def _end_frame(event: ResultEvent, job_id: str, skip: int = 0, named: bool = False) -> bytes:
    """``[DONE]``, after an error event if the job did not complete. A Responses stream
    (``named``) ends after the engine's last event, as vLLM's and OpenAI's do; its error
    is an ``error`` event whose data holds OpenAI's error object too (the openai client
    raises on it)."""
    error = ended_error(event, job_id)
    if named:
        frame = b"" if error is None else _named_error(error.to_body()["error"])
    elif error is None:
        frame = _DONE
    else:
        frame = b"data: " + orjson.dumps(error.to_body()) + b"\n\n" + _DONE
    if not frame:
        return frame
    return frame if event is SHUTDOWN else _with_ids(event.id, frame, skip)


def _named_error(error: Mapping[str, object]) -> bytes:
    """The Responses API's ``error`` event (``type``, ``code``, ``message``, ``param``)."""
    data = {"type": "error", "code": error.get("code"), "message": error.get("message"),
            "param": error.get("param"), "error": error}  # fmt: skip
    return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


def _decides(event: ResultEvent) -> bool:
    """Whether the event ends a hold: the engine's acceptance, output, an end, or a lull
    (a fence entry is none)."""
    return event.accepted or event.chunk is not None or _ends(event) or event is _LULL


def _ends(event: ResultEvent) -> bool:
    return event.end is not None or event is SHUTDOWN or event is _GONE


async def _held(job: FollowedJob, heartbeat: _Heartbeat) -> list[ResultEvent]:
    """The events up to the first that decides the response's status (see the module's
    docstring); entries that are no output (a preemption's fence) are left out."""
    while True:
        batch = [event for event in await job.events.take() if _decides(event)]
        heartbeat.batches += 1
        if batch:
            return batch


def _ended_before_output(batch: list[ResultEvent]) -> ResultEvent | None:
    """The event that ends the stream before anything was sent, if one does."""
    for event in batch:
        if event is not _LULL:
            return event if _ends(event) else None
    return None


def _frames(batch: list[ResultEvent], job: FollowedJob) -> bytes:
    out = []
    for event in batch:
        skip = 0
        if job.skip and event.id == job.resume_entry:
            skip, job.skip = job.skip, 0
        if event.chunk is not None:
            out.append(_with_ids(event.id, event.chunk, skip))
        elif event.end is not None or event is SHUTDOWN:
            out.append(_end_frame(event, job.id, skip, job.named_events))
    return b"".join(out)


async def _send_events(
    job: FollowedJob,
    send: Send,
    write: BodyWriter | None,
    heartbeat: _Heartbeat,
    taken: list[ResultEvent] | None,
) -> None:
    """Send the job's events as they arrive (``taken``, those taken during the hold,
    first), until its end, a shutdown or the client leaves.

    With ``write``, the reader writes the tokens that find this task idle itself.
    """
    if write is not None:
        job.events.handler = _write_at_once(job, heartbeat, write)
    try:
        while True:
            if taken is None:
                taken = await job.events.take()
                heartbeat.batches += 1
            batch, taken = _to_send(taken), None
            if batch is None:
                await send(_body(_KEEPALIVE))
                continue
            last = batch[-1]
            if last is _GONE:
                return  # job.ended stays False: release cancels the job
            data = _frames(batch, job)
            if last.end is not None:
                job.ended = True  # before the write: a client leaving now cancels nothing
                await send(_body(data))
                return
            if last is SHUTDOWN:
                await send(_body(data))  # job.ended stays False: release cancels the job
                return
            if data:
                job.delivered = True
                await send(_body(data))
    finally:
        job.events.handler = None


def _write_at_once(
    job: FollowedJob, heartbeat: _Heartbeat, write: BodyWriter
) -> Callable[[ResultEvent], bool]:
    """The mailbox's handler: a token's event straight to the client, if it can go now."""

    def handle(event: ResultEvent) -> bool:
        if event.chunk is None or job.skip or not write(_with_ids(event.id, event.chunk)):
            return False  # not a plain token, a resumed entry, or the client must catch up
        job.delivered = True
        heartbeat.batches += 1
        return True

    return handle


def _body(data: bytes) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": True}


async def _watch_disconnect(receive: Receive, events: Mailbox[ResultEvent]) -> None:
    """Put ``_GONE`` in the job's mailbox once the server reports the client gone."""
    while (await receive())["type"] != "http.disconnect":
        pass
    events.put_nowait(_GONE)


class JobStreamResponse(Response):
    """An SSE response that releases its job however the response ends.

    A plain ASGI response rather than Starlette's ``StreamingResponse``, which runs a
    task group and a body generator for each response and passes every chunk through
    both. Here the task that sends also takes the events from the job's mailbox, and
    one small task per response waits for the client's disconnect (the ASGI server
    reports it only through ``receive``) and ends the stream through the mailbox.
    With ``hold``, the headers wait for the first event that decides them (see the
    module's docstring).
    """

    media_type = "text/event-stream"

    def __init__(self, job: FollowedJob, *, hold: bool = False) -> None:
        # Response.__init__ would add a content-length: this body's length is not known.
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = [
            (JOB_HEADER.lower().encode(), job.id.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            (b"content-type", b"text/event-stream; charset=utf-8"),
        ]
        if job.replayed:
            self.raw_headers.append((REPLAYED_HEADER.lower().encode(), b"true"))
        self.raw_headers += [(k.lower().encode(), v.encode()) for k, v in job.quota_headers.items()]
        self.job = job
        self.hold = hold

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(_watch_disconnect(receive, self.job.events))
        try:
            # The response goes out from a task of its own: a token that does not find it
            # idle (or any token, without a body writer) wakes the task that sends it, and a
            # wake-up reaches a coroutine through every frame that awaits it. Here that would
            # be ~18 frames of middlewares and routing, twice per token.
            await asyncio.create_task(self._respond(scope, receive, send))
        except OSError:
            pass  # the client is gone (a server that reports it by failing the send)
        finally:
            watcher.cancel()
            await self.job.gateway.finish(self.job.release())

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        job, heartbeat = self.job, _Heartbeat(self.job.events)
        try:
            taken = await _held(job, heartbeat) if self.hold else None
            ended = _ended_before_output(taken) if taken else None
            if ended is _GONE:
                return  # nobody to answer; job.ended stays False: release cancels the job
            error = ended_error(ended, job.id) if ended is not None else None
            if error is not None:
                # As the same request not streamed is answered (``completions``).
                job.ended = ended is not SHUTDOWN  # a shutdown's release cancels the job
                await error_response(error, job.headers())(scope, receive, send)
                return
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await send(start)  # through every middleware: they see the response begin
            # The body goes straight to the server, past middlewares that only watch the
            # start (none of ours changes a body; one that did would have to be outermost).
            send_body: Send = scope.get(SERVER_SEND, send)
            await _send_events(job, send_body, body_writer(send_body), heartbeat, taken)
            await send_body({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            heartbeat.cancel()
