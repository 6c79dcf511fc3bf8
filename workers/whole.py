"""A whole answer rebuilt from the engine's stream (pure, no I/O).

A job whose client wants one body (``StreamMode.WHOLE``) is streamed from the engine, so
that fairq sees its first token at once (``broker.requests.stream_mode`` says which jobs).
``WholeAnswer`` takes the stream's events as the worker reads them and builds the body the
engine would have answered with: per choice the text (completions) or the message's
role and text fields (chat: content, and reasoning where the engine streams it), the last
finish and stop reasons; the response's id, creation time, model and fingerprint; and the
usage from the stream's usage chunk. Fields an engine adds to a whole answer that carry
nothing for these requests (vLLM's null ``prompt_logprobs``, ``kv_transfer_params``, ...)
are left out. Only requests whose fields make the stream the whole answer are streamed
(``broker.requests.WHOLE_FIELDS``): no tools, log probabilities or echoed prompts.
"""

from __future__ import annotations

from typing import Any

import orjson

from broker import RequestKind

_OBJECT = {RequestKind.CHAT: "chat.completion", RequestKind.COMPLETION: "text_completion"}
_TOP_KEPT = ("system_fingerprint", "service_tier")  # kept where a chunk has them, not null
_DELTA_SKIPPED = ("role", "tool_calls")


class WholeAnswer:
    """The body of one attempt's answer, built from its stream's events."""

    def __init__(self, kind: RequestKind) -> None:
        self._kind = kind
        self._head: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        # Per choice, each text field's pieces, joined once in ``body``: appending to a
        # string kept in a dict copies it each time, quadratic in a long answer's length.
        self._texts: dict[int, dict[str, list[str]]] = {}

    def add(self, events: bytes) -> None:
        """Take in complete ``data: {...}`` events, as the engine's accounting passed them
        on (checked, the usage chunk kept: the body's usage is the accounting's)."""
        for event in events.split(b"\n\n"):
            if event.startswith(b"data: {"):
                self._add_chunk(orjson.loads(event[6:]))

    def body(self, usage: dict[str, Any] | None, service_tier: str | None = None) -> bytes:
        """The whole answer as the engine's JSON body; ``service_tier``, the tier fairq
        served it in, replaces any the engine streamed."""
        body: dict[str, Any] = {
            "id": self._head.get("id"),
            "object": _OBJECT[self._kind],
            "created": self._head.get("created"),
            "model": self._head.get("model"),
            "choices": [self._choice(i) for i in sorted(self._choices)],
        }
        body.update((key, self._head[key]) for key in _TOP_KEPT if key in self._head)
        if service_tier is not None:
            body["service_tier"] = service_tier
        body["usage"] = usage
        return orjson.dumps(body)

    def _add_chunk(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "created", "model"):
            self._head.setdefault(key, chunk.get(key))
        for key in _TOP_KEPT:
            if chunk.get(key) is not None:
                self._head[key] = chunk[key]
        for part in chunk.get("choices") or ():
            self._add_part(part)

    def _add_part(self, part: dict[str, Any]) -> None:
        index = part.get("index", 0)
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = self._new_choice(index)
            self._texts[index] = {}
        texts = self._texts[index]
        if self._kind is RequestKind.CHAT:
            delta = part.get("delta") or {}
            if isinstance(delta.get("role"), str):
                choice["message"]["role"] = delta["role"]
            for key, value in delta.items():
                if key not in _DELTA_SKIPPED and isinstance(value, str):
                    texts.setdefault(key, []).append(value)
        elif part.get("text"):
            texts.setdefault("text", []).append(part["text"])
        for key in ("finish_reason", "stop_reason"):
            if part.get(key) is not None:
                choice[key] = part[key]

    def _choice(self, index: int) -> dict[str, Any]:
        """The choice with its text fields joined (chat: into its message)."""
        choice = dict(self._choices[index])
        joined = {key: "".join(pieces) for key, pieces in self._texts[index].items()}
        if self._kind is RequestKind.CHAT:
            choice["message"] = {**choice["message"], **joined}
        else:
            choice.update(joined)
        return choice

    def _new_choice(self, index: int) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": index}
        if self._kind is RequestKind.CHAT:
            choice["message"] = {"role": "assistant", "content": None}
        else:
            choice["text"] = ""
        choice.update(logprobs=None, finish_reason=None, stop_reason=None)
        return choice
