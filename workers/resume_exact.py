"""Going on with a streamed answer exactly where it was cut, from token ids (pure, no I/O).

The first attempt of a resumable job recorded the prompt's token ids and every event's
(``workers.token_ids``) beside the chunks its client got. When preemption takes the job
back mid-answer (``park.lua``), the next attempt, on any worker, reads them back
(``Seam``) and asks vLLM's ``/v1/completions`` for the rest with the prompt given as
those ids: the prompt's, then the answer's so far. The engine starts from the very
tokens it had produced, so nothing is tokenised anew and no token is repeated or lost;
with greedy sampling the answer is the one an uncut run gives.

What the client gets next is converted to its request's shape (``Reshaper``): a chat
client gets chat chunks (``delta.content``), and every chunk carries the first
attempt's ``id``, ``created`` and ``model``, with the token id lists as ``null``. The
usage counts every token once: the original prompt's tokens and all the answer's
(``workers.resume.counted_once`` with the earlier tokens, as for the text path).

The seam. vLLM holds back the text of a token that ends inside a multi-byte character
(its event has empty text) until a later token completes it. Continuing from such a
token would make the engine's detokenizer start mid-character (vLLM 0.32 then sends
text of the prompt again). So the prompt stops after the last token whose text the
client has, and those trailing tokens are generated again: their text had not been
sent, so nothing repeats. The attempt records how many it generated again (``redone``)
with its first entry, for a later resume to drop them from the earlier ones.

Not exact, and the caller falls back (``workers.resume``): no prompt ids recorded (an
engine that ignored ``return_token_ids``), events and id groups that do not pair up, or
chat deltas other than content (a reasoning parser's, tool calls), which a completion
cannot reproduce.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from broker import RequestKind, TokenTrail, WrittenEntry
from workers.token_ids import parse_groups, parse_ids

COMPLETIONS_PATH = "/v1/completions"
# vLLM's own default for a completion without max_tokens (CompletionRequest.max_tokens).
COMPLETION_DEFAULT_MAX_TOKENS = 16
# Chat request fields a completion has no use for; every other field (the sampling
# parameters) goes on unchanged. Not resumable ones (tools, logprobs...) never get here.
_CHAT_ONLY = frozenset({
    "messages", "max_completion_tokens", "add_generation_prompt", "continue_final_message",
    "chat_template", "chat_template_kwargs", "documents", "tool_choice", "parallel_tool_calls",
    "reasoning_effort", "include_reasoning", "mm_processor_kwargs", "truncate_prompt_tokens",
    "return_prompt_text", "add_special_tokens", "echo",
})  # fmt: skip
_PLAIN_DELTA = frozenset({"role", "content"})


@dataclass(frozen=True)
class Ident:
    """What every chunk of one answer repeats: its client saw these first."""

    id: str
    created: int
    model: str


@dataclass(frozen=True)
class Seam:
    """Where an answer goes on: the engine's prompt is ``prompt + kept``."""

    prompt: list[int]
    kept: list[int]  # the answer's tokens whose text the client has
    redone: int  # trailing token groups without text yet: generated again
    ident: Ident


def seam_of(kind: RequestKind, entries: Sequence[WrittenEntry]) -> Seam | None:
    """The seam of an answer from the chunk entries its client got; None when the ids
    recorded cannot make the answer go on exactly (see the module docstring)."""
    if not entries or not entries[0].trail.prompt_tokens:
        return None
    groups: list[tuple[list[int], bool]] = []  # per event with ids: (ids, its text was sent)
    ident = None
    for entry in entries:
        if entry.trail.redone > len(groups):
            return None
        del groups[len(groups) - entry.trail.redone :]
        events = list(_events(entry.chunk))
        marked = [choice for choice in _choices(events) if "token_ids" in choice]
        ids = parse_groups(entry.trail.tokens)
        if len(marked) != len(ids) or not all(_plain(kind, c) for c in marked):
            return None
        groups += [(group, bool(_text(kind, c))) for c, group in zip(marked, ids, strict=True)]
        ident = ident or _ident(events)
    if ident is None:
        return None
    redone = 0
    while groups and not groups[-1][1]:
        groups.pop()
        redone += 1
    kept = [token for group, _ in groups for token in group]
    return Seam(parse_ids(entries[0].trail.prompt_tokens), kept, redone, ident)


def _events(chunk: bytes) -> Iterator[dict[str, Any]]:
    for event in chunk.split(b"\n\n"):
        if event.startswith(b"data: {"):
            yield orjson.loads(event[6:])


def _choices(events: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for event in events:
        yield from event.get("choices") or []


def _plain(kind: RequestKind, choice: dict[str, Any]) -> bool:
    """A choice a completion's chunk can stand for: text, or chat content alone."""
    return kind is RequestKind.COMPLETION or set(choice.get("delta") or {}) <= _PLAIN_DELTA


def _text(kind: RequestKind, choice: dict[str, Any]) -> str:
    if kind is RequestKind.CHAT:
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


def _ident(events: list[dict[str, Any]]) -> Ident | None:
    for event in events:
        if "id" in event:
            created, model = int(event.get("created") or 0), str(event.get("model") or "")
            return Ident(str(event["id"]), created, model)
    return None


def token_continuation(
    kind: RequestKind, payload: bytes, seam: Seam, context_len: int | None
) -> bytes | None:
    """The ``/v1/completions`` request for the rest of the answer; None when nothing is
    left to ask. Raises ``LookupError`` when its length cannot be known: a chat request
    without a token limit runs to the context's end, and ``context_len`` is unknown."""
    body = orjson.loads(payload)
    left = _tokens_left(kind, body, seam, context_len)
    if left <= 0:
        return None
    out = {k: v for k, v in body.items() if k not in _CHAT_ONLY}
    out["prompt"] = seam.prompt + seam.kept
    out["max_tokens"] = left
    if isinstance(body.get("min_tokens"), int):
        out["min_tokens"] = max(0, body["min_tokens"] - len(seam.kept))
    out["return_token_ids"] = True
    return orjson.dumps(out)


def needs_context_len(kind: RequestKind, payload: bytes) -> bool:
    """Whether ``token_continuation`` needs the engine's context length: for a chat request
    without a token limit (it runs to the context's end). A limit never needs it: it was
    within the context, or the first attempt would have been refused."""
    if kind is not RequestKind.CHAT:
        return False
    body = orjson.loads(payload)
    return not any(isinstance(body.get(f), int) for f in ("max_tokens", "max_completion_tokens"))


def _tokens_left(
    kind: RequestKind, body: dict[str, Any], seam: Seam, context_len: int | None
) -> int:
    """vLLM's limit of the whole answer (its explicit limit, else the chat's context or
    the completion's default, and never beyond the context), less the tokens kept."""
    limit = body.get("max_tokens")
    if kind is RequestKind.CHAT and body.get("max_completion_tokens") is not None:
        limit = body["max_completion_tokens"]  # vLLM prefers it
    room = None if context_len is None else context_len - len(seam.prompt)
    if not isinstance(limit, int):
        if kind is RequestKind.COMPLETION:
            limit = COMPLETION_DEFAULT_MAX_TOKENS
        elif room is None:
            raise LookupError("the engine's context length is unknown")
        else:
            limit = room
    if room is not None:
        limit = min(limit, room)
    return int(limit) - len(seam.kept)


def owed_usage(entries: Sequence[WrittenEntry], completion_tokens: int) -> bytes | None:
    """The usage chunk owed to the client of an answer whose earlier attempts sent all its
    tokens but not its usage (taken back between its last token and its usage chunk): the
    first attempt's ``id``, ``created`` and ``model``, the prompt's tokens from the ids it
    recorded. None when the client had the usage already, or no prompt ids were recorded
    (an engine that ignored ``return_token_ids``: the prompt's length is unknown)."""
    if not entries or not entries[0].trail.prompt_tokens:
        return None
    events = [e for entry in entries for e in _events(entry.chunk)]
    if any(isinstance(e.get("usage"), dict) for e in events):
        return None
    first = next((e for e in events if "id" in e), None)
    if first is None:
        return None
    prompt = len(parse_ids(entries[0].trail.prompt_tokens))
    usage = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    kept = ("id", "object", "created", "model", "system_fingerprint")
    event = {k: first[k] for k in kept if k in first} | {"choices": [], "usage": usage}
    return b"data: %s\n\n" % orjson.dumps(event)


class Reshaper:
    """Turns the continuation's completion chunks into what the client's stream needs, and
    records their token ids (the first with how many earlier groups were ``redone``)."""

    def __init__(self, kind: RequestKind, seam: Seam) -> None:
        self._chat = kind is RequestKind.CHAT
        self._ident = seam.ident
        self._redone = seam.redone

    def __call__(self, events: bytes) -> tuple[bytes, TokenTrail]:
        groups: list[bytes] = []
        out = [b"data: %s\n\n" % orjson.dumps(self._shaped(e, groups)) for e in _events(events)]
        trail = TokenTrail(b";".join(groups), redone=self._redone)
        self._redone = 0
        return b"".join(out), trail

    def _shaped(self, event: dict[str, Any], groups: list[bytes]) -> dict[str, Any]:
        ident, out = self._ident, dict(event)
        out["id"], out["created"], out["model"] = ident.id, ident.created, ident.model
        if self._chat:
            out["object"] = "chat.completion.chunk"
        out["choices"] = [self._choice(c, groups) for c in event.get("choices") or []]
        return out

    def _choice(self, choice: dict[str, Any], groups: list[bytes]) -> dict[str, Any]:
        if "token_ids" in choice:
            groups.append(b",".join(b"%d" % t for t in choice["token_ids"] or []))
        if not self._chat:
            return choice | {"prompt_token_ids": None, "token_ids": None}
        # vLLM's chat chunk: stop_reason only on the last, token_ids always (null).
        out: dict[str, Any] = {
            "index": choice.get("index", 0),
            "delta": {"content": choice.get("text") or ""},
            "logprobs": None,
            "finish_reason": choice.get("finish_reason"),
        }
        if out["finish_reason"] is not None:
            out["stop_reason"] = choice.get("stop_reason")
        out["token_ids"] = None
        return out
