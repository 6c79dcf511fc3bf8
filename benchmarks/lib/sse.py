"""Reading one streamed answer cheaply: its first token, its events over time, its usage.

A flood of long streamed answers reaches the load client as hundreds of thousands
of SSE events; parsing each as JSON would take CPU from the stack being measured
on the same cores. So ``StreamTally`` parses whole lines only until the first
event with content (the time to first token), then only counts events
(``data: {``) per time bucket, and reads ``usage`` (or an error) from the
stream's tail when it ends. One event carries one token in vLLM and the
simulator; the counts are scaled to ``usage`` where tokens are needed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

MARKER = b"data: {"
TAIL_BYTES = 16_384  # the usage event and [DONE] fit many times over


def _content(event: dict[str, Any]) -> bool:
    choices = event.get("choices")
    if not choices or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    delta = choice.get("delta")
    return bool((delta.get("content") if isinstance(delta, dict) else None) or choice.get("text"))


def _event(line: bytes) -> dict[str, Any] | None:
    if not line.startswith(MARKER):
        return None
    try:
        event = orjson.loads(line[6:])
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


@dataclass
class StreamTally:
    """Fed the stream's bytes as they arrive; times are seconds after ``origin``."""

    origin: float
    bucket_s: float | None = None  # None: no counts over time
    first_token_s: float | None = None
    events: int = 0  # from the first event with content on
    buckets: dict[int, int] = field(default_factory=dict)  # bucket -> events
    error: str | None = None  # an error event before the first token
    # Each read with events from the first token on, (when, events), if asked for (None:
    # not kept): a stream's inter-token latencies
    reads: list[tuple[float, int]] | None = None
    _pending: bytes = b""  # before the first token: an unfinished line
    _carry: bytes = b""  # after it: the last bytes, which may start a marker
    _recent: deque[bytes] = field(default_factory=deque)  # the last pieces, for the tail
    _recent_bytes: int = 0

    def feed(self, data: bytes, now: float) -> None:
        self._keep(data)
        if self.first_token_s is None:
            data = self._until_first(data, now)
            if self.first_token_s is None:
                return
        # No suffix of MARKER starts one, so a carried prefix is never counted twice.
        buf = self._carry + data
        self._carry = buf[-(len(MARKER) - 1) :]
        self._add(buf.count(MARKER), now)

    def _keep(self, data: bytes) -> None:
        """Keep about the last TAIL_BYTES, without copying them on every piece."""
        self._recent.append(data)
        self._recent_bytes += len(data)
        while self._recent_bytes - len(self._recent[0]) >= TAIL_BYTES:
            self._recent_bytes -= len(self._recent.popleft())

    def _tail_lines(self) -> list[bytes]:
        return b"".join(self._recent)[-TAIL_BYTES:].split(b"\n")

    def _until_first(self, data: bytes, now: float) -> bytes:
        """Parse whole lines until one has content; returns the bytes after that line."""
        buf, pos = self._pending + data, 0
        while (end := buf.find(b"\n", pos)) >= 0:
            event, pos = _event(buf[pos:end]), end + 1
            if event is None:
                continue
            if "error" in event and self.error is None:
                self.error = f"error event: {str(event['error'])[:200]}"
            if _content(event):
                self.first_token_s = now - self.origin
                self._add(1, now)
                self._pending = b""
                return buf[pos:]
        self._pending = buf[pos:]
        return b""

    def _add(self, events: int, now: float) -> None:
        if events <= 0:
            return
        self.events += events
        if self.reads is not None:
            self.reads.append((now - self.origin, events))
        if self.bucket_s is not None:
            bucket = int((now - self.origin) / self.bucket_s)
            self.buckets[bucket] = self.buckets.get(bucket, 0) + events

    def usage_tokens(self) -> int | None:
        """``completion_tokens`` of the last usage event in the tail (None: none came)."""
        for line in reversed(self._tail_lines()):
            if b'"usage"' not in line:
                continue
            event = _event(line)
            usage = event.get("usage") if event else None
            if isinstance(usage, dict) and "completion_tokens" in usage:
                return int(usage["completion_tokens"])
        return None

    def tail_error(self) -> str | None:
        """An error event near the end of the stream (a failure after the first token)."""
        for line in reversed(self._tail_lines()):
            event = _event(line) if b'"error"' in line else None
            if event is not None and "error" in event:
                return f"error event: {str(event['error'])[:200]}"
        return self.error
