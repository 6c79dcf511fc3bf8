"""Jobs: ids, states and the record a job hash holds.

Who owns a job at each stage (the hand-over is done by one Lua script each):

    queued      the broker: an entry in the user's queue stream (enqueue.lua)
    dispatched  the ready stream: an entry not yet read by a worker (dispatch.lua)
    running     one worker, that read the ready entry (start.lua)
    terminal    nobody; set exactly once (complete.lua or cancel.lua), then expires

A job id embeds its model (URL-safe base64) so that any process can find the
job's hash-tagged keys from the id alone, without a global index.
"""

from __future__ import annotations

import base64
import binascii
import enum
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from broker import job_fields as jf
from broker import keys

if TYPE_CHECKING:
    from broker.idempotency import Idempotency


class JobState(enum.StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self not in (JobState.QUEUED, JobState.DISPATCHED, JobState.RUNNING)


class RequestKind(enum.StrEnum):
    """The OpenAI endpoint a job is for; ``path`` is the same on fairq and on the engine."""

    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"  # one whole answer: vectors and prompt tokens, never streamed
    RESPONSE = "response"  # the Responses API: its own body, usage and stream events

    @property
    def path(self) -> str:
        return _PATHS[self]

    @property
    def generates(self) -> bool:
        """Chat or completions: an answer of choices, streamed as ``data:`` chunks ending
        with ``[DONE]``, which fairq's resumption and whole-answer rebuild understand."""
        return self is RequestKind.CHAT or self is RequestKind.COMPLETION


_PATHS = {
    RequestKind.CHAT: "/v1/chat/completions",
    RequestKind.COMPLETION: "/v1/completions",
    RequestKind.EMBEDDING: "/v1/embeddings",
    RequestKind.RESPONSE: "/v1/responses",
}


class StreamMode(enum.StrEnum):
    """How a job's answer travels; the value is the job hash's and the ready entry's 's'."""

    PLAIN = "0"  # not streamed: one body
    STREAMED = "1"  # server-sent events
    WITH_USAGE = "2"  # streamed, ending with the usage chunk (stream_options.include_usage)
    # One body for its client, streamed from the engine to the worker, which rebuilds the
    # whole answer (``workers.whole``): fairq sees its first token at once, as a streamed
    # job's (``ModelConfig.stream_from_engine``).
    WHOLE = "3"

    @property
    def to_client(self) -> bool:
        """The client reads server-sent events (else one body)."""
        return self is StreamMode.STREAMED or self is StreamMode.WITH_USAGE

    @property
    def from_engine(self) -> bool:
        """The engine streams the answer, so its first token is seen as it comes (the Lua
        scripts read the wire value: any but '0')."""
        return self is not StreamMode.PLAIN


@dataclass(frozen=True)
class Submission:
    """One request to queue; ``user`` is the fairness unit, ``owner`` the key's user."""

    model: str
    owner: str
    user: str
    tenant: str
    band: str
    kind: RequestKind
    stream_flag: StreamMode
    payload: bytes
    job_id: str | None = None
    cost: float = 0.0  # estimated service in weighted tokens (token-fair)
    tokens: int = 0  # estimated prompt and output tokens, charged to quotas (broker.quotas)
    weight: float = 1.0  # the key's fairness weight
    # Its own queue deadline, ms after it is queued: shorter than its band's, which holds
    # where this is None (``broker.deadlines``).
    max_queue_ms: int | None = None
    # An Idempotency-Key: enqueue.lua makes the job once per key (``broker.idempotency``).
    once: Idempotency | None = None


def new_job_id(model: str, suffix: str | None = None) -> str:
    """A job id of ``model``: random, or ``suffix`` (unique per model) for a deterministic one."""
    encoded = base64.urlsafe_b64encode(model.encode()).rstrip(b"=").decode()
    return f"{encoded}.{suffix or secrets.token_hex(10)}"


def model_of(job_id: str) -> str | None:
    """The model a job id belongs to, or None when the id is not one of ours."""
    encoded, dot, rest = job_id.partition(".")
    if not dot or not rest or len(job_id) > 400:
        return None
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


def _ms(value: bytes | None) -> int | None:
    return int(value) if value else None


def _enqueued_ms(h: dict[bytes, bytes]) -> int | None:
    """'tq', or for a queued job (which keeps no 'tq') its queue entry's time ('qe' = ms-seq)."""
    queued = h.get(jf.QUEUED_MS) or h.get(jf.QUEUE_ENTRY, b"").partition(b"-")[0]
    return int(queued) if queued else None


def owner_of(h: dict[bytes, bytes]) -> str:
    """The API key's user that owns a job: 'o', kept only where it differs from 'u'."""
    return (h.get(jf.OWNER) or h.get(jf.USER) or b"").decode()


@dataclass(frozen=True)
class JobRecord:
    """A job as stored in its hash (fields of ``fq:{m}:job:{id}``, see ``broker.keys``)."""

    id: str
    model: str
    state: JobState
    user: str
    tenant: str
    band: str
    kind: RequestKind
    stream: bool
    endpoint: str | None
    enqueued_ms: int | None
    dispatched_ms: int | None
    started_ms: int | None
    first_token_ms: int | None
    ended_ms: int | None
    attempts: int
    finish_reason: str | None
    usage: dict[str, int] | None
    error: dict[str, object] | None

    @classmethod
    def from_hash(cls, job_id: str, model: str, h: dict[bytes, bytes]) -> JobRecord:
        def s(field: bytes) -> str | None:
            value = h.get(field)
            return value.decode() if value else None

        usage, error = h.get(jf.USAGE), h.get(jf.ERROR)
        band = s(jf.BAND) or ""
        return cls(
            id=job_id,
            model=model,
            state=JobState(h[jf.STATE].decode()),
            user=s(jf.USER) or "",
            tenant=s(jf.TENANT) or keys.tenant_of_field(band, s(jf.TENANT_FIELD) or ""),
            band=band,
            kind=RequestKind(s(jf.KIND) or "chat"),
            stream=StreamMode(h.get(jf.STREAM, b"0").decode()).to_client,
            endpoint=s(jf.ENDPOINT),
            enqueued_ms=_enqueued_ms(h),
            dispatched_ms=_ms(h.get(jf.DISPATCHED_MS)),
            started_ms=_ms(h.get(jf.STARTED_MS)),
            first_token_ms=_ms(h.get(jf.FIRST_TOKEN_MS)),
            ended_ms=_ms(h.get(jf.ENDED_MS)),
            attempts=int(h.get(jf.ATTEMPTS) or 0),
            finish_reason=s(jf.FINISH_REASON),
            usage=orjson.loads(usage) if usage else None,
            error=orjson.loads(error) if error else None,
        )

    def public(self) -> dict[str, object]:
        """The job as the API shows it to its owner."""
        return {
            "id": self.id,
            "object": "fairq.job",
            "model": self.model,
            "status": self.state.value,
            "band": self.band,
            "kind": self.kind.value,
            "stream": self.stream,
            "attempts": self.attempts,
            "created_at_ms": self.enqueued_ms,
            "dispatched_at_ms": self.dispatched_ms,
            "started_at_ms": self.started_ms,
            "first_token_at_ms": self.first_token_ms,
            "ended_at_ms": self.ended_ms,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "error": self.error,
        }
