"""Going on from its text with a streamed answer taken back out of the engine (pure).

When a newcomer needs a batch slot, the dispatcher may take a streamed job back out of
the engine mid-answer (``park.lua``). Its client keeps the tokens it has. The next
attempt goes on from the token ids recorded with them when it can
(``workers.resume_exact``). This is the fallback (``resume_streams: text``, or ids that
do not pair up), which asks the engine for the rest: the prompt plus the text already
sent, as an assistant message to continue (vLLM's ``continue_final_message``) for chat,
or the prompt extended by that text for a completion, with ``max_tokens`` less the
tokens already sent. No token is sent twice: the earlier text is read back from the job's
result stream, which holds exactly what the client got.

Tokens are counted as streamed chunks with text: an engine streams one token per chunk
(vLLM's default), so the count is exact for it and an estimate for one that batches
tokens into chunks. The final usage is counted once: completion tokens are the earlier
ones plus the new ones; prompt tokens are the new attempt's prompt less the earlier
text's tokens (its re-tokenisation may differ by a token at the seam).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from broker import RequestKind

_ROLE_ONLY = b'"role":"assistant"'
_FINISH_MARK = b'"finish_reason":"'


@dataclass(frozen=True)
class Earlier:
    """What the client has already received of the answer."""

    text: str
    tokens: int
    finish_reason: str | None = None  # the answer had ended already


def earlier_output(kind: RequestKind, chunks: Iterable[bytes]) -> Earlier:
    """The text, token count and finish reason of the SSE chunks already written."""
    parts: list[str] = []
    tokens = 0
    finish = None
    for piece in chunks:
        for event in piece.split(b"\n\n"):
            if not event.startswith(b"data: {"):
                continue
            choices = orjson.loads(event[6:]).get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            text = _text(kind, choice)
            if text:
                parts.append(text)
                tokens += 1
            finish = choice.get("finish_reason") or finish
    return Earlier("".join(parts), tokens, finish)


def _text(kind: RequestKind, choice: dict[str, Any]) -> str:
    if kind is RequestKind.CHAT:
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")


def continuation(kind: RequestKind, payload: bytes, earlier: Earlier) -> bytes | None:
    """The engine request for the rest of the answer; None when nothing is left to ask."""
    if earlier.finish_reason is not None:
        return None
    body = orjson.loads(payload)
    limit_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    limit = body.get(limit_field)
    if isinstance(limit, int):
        if limit - earlier.tokens <= 0:
            return None
        body[limit_field] = limit - earlier.tokens
    if isinstance(body.get("min_tokens"), int):
        body["min_tokens"] = max(0, body["min_tokens"] - earlier.tokens)
    if kind is RequestKind.CHAT:
        body["messages"] = [*body["messages"], {"role": "assistant", "content": earlier.text}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        body["prompt"] = str(body["prompt"]) + earlier.text
    return orjson.dumps(body)


def counted_once(usage: dict[str, int], earlier: Earlier) -> dict[str, int]:
    """The usage of the whole answer, from the resumed attempt's and the earlier tokens."""
    prompt = int(usage.get("prompt_tokens", 0))
    completion = int(usage.get("completion_tokens", 0))
    whole = dict(usage)
    whole["prompt_tokens"] = max(0, prompt - earlier.tokens)
    whole["completion_tokens"] = completion + earlier.tokens
    whole["total_tokens"] = whole["prompt_tokens"] + whole["completion_tokens"]
    return whole


def drops_role_chunk(events: bytes) -> bytes:
    """A resumed chat stream's events without its opening role-only chunk (the client had
    one from the first attempt); other events pass as they are."""
    if _ROLE_ONLY not in events:
        return events
    kept = [
        event
        for event in events.split(b"\n\n")[:-1]
        if not (_ROLE_ONLY in event and _FINISH_MARK not in event and _empty_content(event))
    ]
    return b"".join(event + b"\n\n" for event in kept)


def _empty_content(event: bytes) -> bool:
    choices = orjson.loads(event[6:]).get("choices") or [{}]
    return not (choices[0].get("delta") or {}).get("content")
