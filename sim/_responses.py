"""ASGI responses that follow one engine sequence to the client.

Both abort their sequence the moment the client disconnects (a watcher task on
`receive`), including while it still waits for a slot, and in any case when
they end: a sequence never outlives its HTTP request. They are written as raw
ASGI callables, not StreamingResponse, so a token costs one `send` and no
task-group or thread hop.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sim._engine import Engine, SimSequence
from sim._faults import Fault, error_event, malformed_event
from sim._scheduler import SeqStatus
from sim._wire import (
    DONE,
    ResponseMeta,
    StreamFrames,
    chat_response,
    completion_response,
    error_body,
)

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]


class EngineResponse(Response):
    def __init__(self, engine: Engine, seq: SimSequence, meta: ResponseMeta) -> None:
        # Response.__init__ would render a body; these responses build their own.
        self.status_code = 200
        self.background = None
        self._engine = engine
        self._seq = seq
        self._meta = meta
        self._gone = asyncio.Event()  # the client disconnected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.create_task(self._abort_on_disconnect(receive))
        try:
            await self._respond(send)
        except OSError:
            pass  # the peer vanished mid-write; the finally clause aborts the sequence
        finally:
            watcher.cancel()
            self._engine.abort(self._seq)

    async def _respond(self, send: Send) -> None:
        raise NotImplementedError

    async def _abort_on_disconnect(self, receive: Receive) -> None:
        # The body was read already, so the server's next message is the disconnect.
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone.set()
        self._engine.abort(self._seq)


class SseResponse(EngineResponse):
    """`text/event-stream` of vLLM chunks, one per token, then `data: [DONE]`."""

    def __init__(
        self,
        engine: Engine,
        seq: SimSequence,
        meta: ResponseMeta,
        *,
        chat: bool,
        include_usage: bool,
        fault: Fault | None = None,
    ) -> None:
        super().__init__(engine, seq, meta)
        self._frames = StreamFrames(meta, chat=chat)
        self._include_usage = include_usage
        self._fault = fault

    async def _respond(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        seq, sent = self._seq, 0
        fault = self._fault
        if fault is not None and fault.after_tokens == 0 and not await self._misbehave(send):
            return
        while True:
            await seq.wakeup.wait()  # set after every token and on finish or abort
            seq.wakeup.clear()
            if seq.status is SeqStatus.ABORTED:
                # Shutdown or a gone client: end without [DONE], as a dying pod would.
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if self._fault is not None and seq.generated >= self._fault.after_tokens > sent:
                body = self._frames.tokens(sent, self._fault.after_tokens, last=False)
                sent = self._fault.after_tokens
                await send({"type": "http.response.body", "body": body, "more_body": True})
                if not await self._misbehave(send):
                    return
            finished = seq.status is SeqStatus.FINISHED
            # Tokens that piled up while this client was slow go out in one write.
            body = self._frames.tokens(sent, seq.generated, last=finished)
            sent = seq.generated
            if finished:
                body += self._frames.tail(sent, include_usage=self._include_usage)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _misbehave(self, send: Send) -> bool:
        """Act out the fault; False when the response is over."""
        fault = self._fault
        assert fault is not None
        if fault.kind == "hang":
            await _hang(self._gone, fault.hang_s)
            return True
        if fault.kind == "malformed":
            await send({"type": "http.response.body", "body": malformed_event(), "more_body": True})
            return True
        end = error_event(fault) + DONE if fault.kind == "error_event" else b""  # else: cut
        await send({"type": "http.response.body", "body": end, "more_body": False})
        return False


class JsonCompletionResponse(EngineResponse):
    """The whole completion object once the sequence finishes."""

    def __init__(
        self,
        engine: Engine,
        seq: SimSequence,
        meta: ResponseMeta,
        *,
        chat: bool,
        fault: Fault | None = None,
    ) -> None:
        super().__init__(engine, seq, meta)
        self._chat = chat
        self._fault = fault

    async def _respond(self, send: Send) -> None:
        seq = self._seq
        if self._fault is not None and self._fault.kind == "hang":
            await _hang(self._gone, self._fault.hang_s)
        while not seq.done:
            await seq.wakeup.wait()  # set only when it ends: nothing to do per token
            seq.wakeup.clear()
        if seq.status is SeqStatus.ABORTED:
            # Only at shutdown, or for a client already gone (then the send is dropped).
            status = 503
            body = error_body(status, "ServiceUnavailableError", "The engine is shutting down.")
        else:
            body, status = self._render(seq.generated), 200
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _render(self, generated: int) -> bytes:
        """The body of the finished sequence (another route's shape in a subclass)."""
        render = chat_response if self._chat else completion_response
        return render(self._meta, generated)


async def _hang(gone: asyncio.Event, hang_s: float) -> None:
    """Send nothing for ``hang_s``, or until the client leaves (the engine goes on)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(gone.wait(), hang_s)
