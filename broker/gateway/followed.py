"""A job this gateway submitted and follows until it ends or its client leaves.

The result stream is followed *before* the job is queued, so no event can be
written before this process reads from the stream's start. The job belongs to
the connection that submitted it: if the client leaves before the job's end
event was read, ``release`` cancels the job (cancel.lua tells the worker to
abort the engine request). A job whose end event was read is never cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from broker.errors import FairqError
from broker.gateway.outcomes import SHUTDOWN
from broker.gateway.state import Gateway
from broker.queue import Submission
from broker.results import ResultEvent

log = logging.getLogger(__name__)


class FollowedJob:
    """One request's job: its event queue, and the cleanup that must run exactly once."""

    def __init__(
        self,
        gateway: Gateway,
        sub: Submission,
        job_id: str,
        events: asyncio.Queue[ResultEvent],
        stack: contextlib.AsyncExitStack,
    ) -> None:
        self.gateway = gateway
        self.sub = sub
        self.id = job_id
        self.events = events
        self.ended = False  # set once the end event was read: nothing left to cancel
        self._stack = stack

    @classmethod
    async def submit(cls, gateway: Gateway, sub: Submission) -> FollowedJob:
        """Follow the job's results, then queue it (QueueFull etc. propagate)."""
        assert sub.job_id is not None, "the payload embeds the id: generate it first"
        stack = contextlib.AsyncExitStack()
        events = await stack.enter_async_context(gateway.reader.follow(sub.model, sub.job_id))
        gateway.track(sub.job_id, events)
        stack.callback(gateway.untrack, sub.job_id)
        try:
            await gateway.queue.submit(sub)
        except BaseException:
            await stack.aclose()
            raise
        return cls(gateway, sub, sub.job_id, events, stack)

    async def release(self) -> None:
        """Stop following; cancel the job first if its client left before it ended."""
        try:
            if not self.ended:
                await self.gateway.queue.cancel(self.id, self.sub.owner)
        except FairqError as exc:
            log.warning("could not cancel job %s after its client left: %s", self.id, exc)
        finally:
            await self._stack.aclose()

    async def result(self) -> tuple[bytes | None, ResultEvent]:
        """The response body (if one was written) and the end event (or ``SHUTDOWN``)."""
        body = None
        while True:
            event = await self.events.get()
            if event.body is not None:
                body = event.body
            elif event.end is not None:
                self.ended = True
                return body, event
            elif event is SHUTDOWN:
                return body, event
