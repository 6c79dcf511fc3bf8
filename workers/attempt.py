"""How one attempt of a job calls the engine (pure, no I/O): the request, and what its
events become on their way to the client.

- A fresh attempt sends the job's payload. One that may be resumed (``Claimed``'s
  ``track_tokens``) also asks for token ids and records them (``workers.token_ids``).
- A job taken back before any output reached its client starts afresh (its attempt
  still writes after the fence, ``Claimed.resume_gen``).
- A resumed attempt goes on exactly, from token ids, when the earlier attempts recorded
  them (``workers.resume_exact``); failing that, from the text its client has
  (``workers.resume``: vLLM's ``continue_final_message``, or the extended prompt), and a
  chat stream's opening role chunk is dropped (the client has the first attempt's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from broker import Claimed, StreamMode, TokenTrail, WrittenEntry
from workers.resume import Earlier, continuation, drops_role_chunk, earlier_output
from workers.resume_exact import (
    COMPLETIONS_PATH,
    Reshaper,
    Seam,
    owed_usage,
    token_continuation,
)
from workers.token_ids import asking_token_ids, take_token_ids

# Events as the engine sent them -> events as the client gets them, with their token ids.
Shape = Callable[[bytes], tuple[bytes, TokenTrail | None]]


@dataclass(frozen=True)
class Attempt:
    url: str
    payload: bytes
    shape: Shape | None = None  # None: the events pass as they are
    earlier: Earlier | None = None  # a resumed answer: counted in its usage
    exact: bool = False  # goes on from token ids


@dataclass(frozen=True)
class Whole:
    """Nothing is left to ask: the earlier attempts sent the whole answer. ``usage``: the
    usage chunk its client is still owed (``resume_exact.owed_usage``), or None."""

    earlier: Earlier
    usage: bytes | None = None


def fresh(job: Claimed) -> Attempt:
    url = job.endpoint + job.kind.path
    if not (job.track_tokens and job.stream):
        return Attempt(url, job.payload)
    return Attempt(url, asking_token_ids(job.payload), take_token_ids)


def resumed(
    job: Claimed, written: Sequence[WrittenEntry], seam: Seam | None, context_len: int | None
) -> Attempt | Whole:
    """The attempt after ``written``; ``seam``: from ``resume_exact.seam_of``."""
    if not written:  # taken back before its first output: nothing to go on from
        return fresh(job)
    earlier = earlier_output(job.kind, [entry.chunk for entry in written])
    if earlier.finish_reason is not None:
        return _whole(job, written, earlier)
    if seam is not None:
        try:
            body = token_continuation(job.kind, job.payload, seam, context_len)
        except LookupError:
            pass  # its length is unknown: from the text, whose request needs none
        else:
            kept = Earlier(earlier.text, len(seam.kept))
            if body is None:
                return _whole(job, written, kept)
            url = job.endpoint + COMPLETIONS_PATH
            return Attempt(url, body, Reshaper(job.kind, seam), kept, exact=True)
    body = continuation(job.kind, job.payload, earlier)
    if body is None:
        return _whole(job, written, earlier)
    return Attempt(job.endpoint + job.kind.path, body, _without_role_chunk(), earlier)


def _whole(job: Claimed, written: Sequence[WrittenEntry], earlier: Earlier) -> Whole:
    """The answer is whole; a client that asked for usage is owed its chunk if the answer
    was taken back before it came."""
    if job.stream_flag is not StreamMode.WITH_USAGE:
        return Whole(earlier)
    return Whole(earlier, owed_usage(written, earlier.tokens))


def _without_role_chunk() -> Shape:
    """Drops the opening role chunk of a resumed chat stream (a completion has none)."""
    opened = False

    def shape(events: bytes) -> tuple[bytes, TokenTrail | None]:
        nonlocal opened
        if not opened:
            events = drops_role_chunk(events)
            opened = bool(events)
        return events, None

    return shape
