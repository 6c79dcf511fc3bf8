"""vLLM 0.32's bytes on the wire: SSE chunks, whole responses and error bodies.

Key order and null fields follow captures of a real vLLM 0.32 (the fixtures in
shared/fixtures/vllm-0.32-cpu). The hot path is a streamed token: each request
pre-renders its chunk JSON once, split around the token text, so a token costs
two byte concatenations with a pre-escaped word instead of a dict and a dump.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from sim._tokens import WORD_BASE, word_index

VLLM_VERSION = "0.32.0"
DONE = b"data: [DONE]\n\n"
_SLOT = "\x00token\x00"  # orjson escapes the NULs, so no model name can forge it
_SLOT_JSON = orjson.dumps(_SLOT)
_IDS_SLOT = "\x00ids\x00"  # where a token's id list goes (vLLM's return_token_ids)
_IDS_SLOT_JSON = orjson.dumps(_IDS_SLOT)

# Short words with leading spaces look like a tokenizer's output pieces.
_LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud "
    "exercitation ullamco laboris nisi aliquip ex ea commodo consequat duis aute irure "
    "in reprehenderit voluptate velit esse cillum fugiat nulla pariatur excepteur sint "
    "occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim id est"
)
WORDS = tuple(f" {word}" for word in _LOREM.split())
_WORDS_JSON = tuple(orjson.dumps(word) for word in WORDS)


def token_json(seed: int, index: int) -> bytes:
    return _WORDS_JSON[word_index(seed, index, len(_WORDS_JSON))]


def token_id(seed: int, index: int) -> int:
    return WORD_BASE + word_index(seed, index, len(WORDS))


def output_text(seed: int, count: int) -> str:
    return "".join(WORDS[word_index(seed, i, len(WORDS))] for i in range(count))


def output_ids(seed: int, count: int) -> list[int]:
    return [token_id(seed, i) for i in range(count)]


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every chunk and response of one request repeats."""

    id: str
    created: int
    model: str
    seed: int  # the answer's word walk (``_tokens.answer_seed``)
    prompt_tokens: int
    finish_reason: str
    fingerprint: str
    # vLLM's return_token_ids: the prompt's ids (None: not asked for)
    prompt_ids: list[int] | None = None


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _split(payload: dict[str, Any]) -> tuple[bytes, bytes]:
    before, after = _sse(payload).split(_SLOT_JSON)
    return before, after


class StreamFrames:
    """Pre-rendered SSE frames of one streamed request.

    A frame is its prefix, the token's text, then its suffix; with token ids asked for
    (``ResponseMeta.prompt_ids``), the suffix is cut where the token's id list goes. A
    completion's first frame carries the prompt's ids too: it is rendered whole.
    """

    __slots__ = ("_chat", "_head", "_ids", "_last", "_meta", "_object", "_prefix", "_suffix")

    def __init__(self, meta: ResponseMeta, *, chat: bool) -> None:
        self._meta = meta
        self._chat = chat
        self._ids = meta.prompt_ids is not None
        self._object = "chat.completion.chunk" if chat else "text_completion"
        choice = _chat_choice if chat else _completion_choice
        self._prefix, self._suffix = _split(self._envelope([choice(None, self._ids)]))
        _, self._last = _split(self._envelope([choice(meta.finish_reason, self._ids)]))
        self._head = _sse(self._chat_head()) if chat else b""

    def tokens(self, start: int, stop: int, *, last: bool) -> bytes:
        """Frames for tokens [start, stop); the role chunk leads the first (chat)."""
        if self._ids:
            frames = [self._frame(i, last and i == stop - 1) for i in range(start, stop)]
        else:
            seed, prefix, suffix = self._meta.seed, self._prefix, self._suffix
            frames = [prefix + token_json(seed, i) + suffix for i in range(start, stop)]
            if frames and last:
                frames[-1] = prefix + token_json(seed, stop - 1) + self._last
        if not frames:
            return b""
        if start == 0:
            frames.insert(0, self._head)
        return b"".join(frames)

    def _frame(self, index: int, last: bool) -> bytes:
        """One token's frame with its id (vLLM's return_token_ids)."""
        seed = self._meta.seed
        if index == 0 and not self._chat:
            return self._first_completion_frame(last)
        before, after = (self._last if last else self._suffix).split(_IDS_SLOT_JSON)
        token = token_json(seed, index)
        return b"%s%s%s[%d]%s" % (self._prefix, token, before, token_id(seed, index), after)

    def _first_completion_frame(self, last: bool) -> bytes:
        choice = _completion_choice(self._meta.finish_reason if last else None, False)
        choice["text"] = orjson.loads(token_json(self._meta.seed, 0))
        choice["prompt_token_ids"] = self._meta.prompt_ids
        choice["token_ids"] = [token_id(self._meta.seed, 0)]
        return _sse(self._envelope([choice]))

    def tail(self, completion_tokens: int, *, include_usage: bool) -> bytes:
        if not include_usage:
            return DONE
        payload = self._envelope([])
        payload["usage"] = _usage(self._meta.prompt_tokens, completion_tokens)
        payload["system_fingerprint"] = self._meta.fingerprint
        return _sse(payload) + DONE

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        meta = self._meta
        return {
            "id": meta.id,
            "object": self._object,
            "created": meta.created,
            "model": meta.model,
            "choices": choices,
        }

    def _chat_head(self) -> dict[str, Any]:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        payload = self._envelope([choice])
        payload["prompt_token_ids"] = self._meta.prompt_ids
        payload["prompt_text"] = None
        return payload


def _chat_choice(finish_reason: str | None, ids: bool = False) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "delta": {"content": _SLOT},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = None  # vLLM adds it to the final chunk only
    choice["token_ids"] = _IDS_SLOT if ids else None
    return choice


def _completion_choice(finish_reason: str | None, ids: bool = False) -> dict[str, Any]:
    return {
        "index": 0,
        "text": _SLOT,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "prompt_token_ids": None,
        "token_ids": _IDS_SLOT if ids else None,
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def chat_response(meta: ResponseMeta, completion_tokens: int) -> bytes:
    """A whole `chat.completion` object, as vLLM returns without streaming."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": output_text(meta.seed, completion_tokens),
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning": None,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": meta.finish_reason,
        "stop_reason": None,
        "token_ids": _answer_ids(meta, completion_tokens),
    }
    body = _response(meta, "chat.completion", choice, completion_tokens)
    body["prompt_logprobs"] = None
    body["prompt_token_ids"] = meta.prompt_ids
    body["kv_transfer_params"] = None
    return orjson.dumps(body)


def completion_response(meta: ResponseMeta, completion_tokens: int) -> bytes:
    """A whole `text_completion` object, as vLLM returns without streaming."""
    choice = {
        "index": 0,
        "text": output_text(meta.seed, completion_tokens),
        "logprobs": None,
        "finish_reason": meta.finish_reason,
        "stop_reason": None,
        "token_ids": _answer_ids(meta, completion_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": meta.prompt_ids,
    }
    body = _response(meta, "text_completion", choice, completion_tokens)
    body["kv_transfer_params"] = None
    return orjson.dumps(body)


def _answer_ids(meta: ResponseMeta, completion_tokens: int) -> list[int] | None:
    return None if meta.prompt_ids is None else output_ids(meta.seed, completion_tokens)


def _response(
    meta: ResponseMeta, object_name: str, choice: dict[str, Any], completion_tokens: int
) -> dict[str, Any]:
    usage: dict[str, Any] = _usage(meta.prompt_tokens, completion_tokens)
    usage["prompt_tokens_details"] = None
    return {
        "id": meta.id,
        "object": object_name,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": meta.fingerprint,
        "usage": usage,
    }


def error_body(status: int, error_type: str, message: str, param: str | None = None) -> bytes:
    """vLLM's error object: {"error": {"message", "type", "param", "code"}}."""
    error = {"message": message, "type": error_type, "param": param, "code": status}
    return orjson.dumps({"error": error})


def models_body(models: list[str], created: int, max_model_len: int) -> bytes:
    """The OpenAI model list, with vLLM's extra fields."""
    data = [
        {
            "id": model,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": max_model_len,
            "permission": [_permission(model, created)],
        }
        for model in models
    ]
    return orjson.dumps({"object": "list", "data": data})


def server_info_body(vllm_config: dict[str, Any], *, as_json: bool) -> bytes:
    """vLLM's GET /server_info (dev mode): its configuration as JSON (``config_format=json``)
    or as one string; ``vllm_config`` holds the parts of vLLM's the simulator has."""
    return orjson.dumps(
        {
            "vllm_config": vllm_config if as_json else repr(vllm_config),
            "vllm_env": {"VLLM_SERVER_DEV_MODE": True},
            "system_env": {},
        }
    )


def _permission(model: str, created: int) -> dict[str, Any]:
    return {
        "id": f"modelperm-{model}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
