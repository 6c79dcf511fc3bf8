"""Turn an OpenAI request body into the few numbers the simulator needs.

Only what shapes timing and output is read: model, prompt size, output length,
streaming flags, and vLLM's extensions `request_id` and `priority`. Everything else in the body is
accepted and ignored. Rejections carry vLLM's status codes and error types.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from sim._errors import RequestError
from sim._faults import Fault, parse_fault
from sim._prefix import block_hashes
from sim._profile import SimProfile

CHARS_PER_TOKEN = 4  # a rough English average; the simulator has no tokenizer
CHAT_TOKENS_PER_MESSAGE = 4  # role markers a chat template adds around each message


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, "BadRequestError", message, param)


@dataclass(frozen=True, slots=True)
class GenRequest:
    chat: bool
    id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
    priority: int
    fault: Fault | None = None
    prompt_ids: tuple[int, ...] | None = None  # a completion's prompt given as token ids
    return_token_ids: bool = False  # vLLM's: the prompt's and each token's ids in the answer
    prefix_blocks: tuple[int, ...] = ()  # the prompt's full blocks for the prefix cache


def parse_request(raw: bytes, *, chat: bool, models: list[str], profile: SimProfile) -> GenRequest:
    body = json_object(raw)
    model = model_of(body, models)
    if body.get("n") not in (None, 1):
        raise bad_request("The engine simulator supports only n=1.")
    prompt_ids = None if chat else _prompt_ids(body)
    if prompt_ids is not None:
        prompt_tokens = len(prompt_ids)
    else:
        prompt_tokens = _chat_prompt_tokens(body) if chat else _completion_prompt_tokens(body)
    requested = _max_tokens(body, chat=chat)
    max_tokens, finish_reason = _output_length(prompt_tokens, requested, profile)
    priority = _priority(body)
    blocks: tuple[int, ...] = ()
    if profile.enable_prefix_caching:
        content = prompt_ids if prompt_ids is not None else _prompt_text(body, chat=chat)
        blocks = block_hashes(content, profile.block_size, prompt_tokens // profile.block_size)
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    return GenRequest(
        chat=chat,
        id=_response_id(body, chat=chat),
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        finish_reason=finish_reason,
        stream=stream,
        include_usage=include_usage,
        priority=priority,
        fault=parse_fault(body, profile.fault),
        prompt_ids=prompt_ids,
        return_token_ids=profile.return_token_ids and body.get("return_token_ids") is True,
        prefix_blocks=blocks,
    )


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"Invalid JSON in request body: {exc}") from exc
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def model_of(body: dict[str, Any], models: list[str]) -> str:
    model = body.get("model")
    if model is None:
        return models[0]  # vLLM serves its first model name when none is given
    if not isinstance(model, str) or model not in models:
        raise RequestError(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
    return model


def _chat_prompt_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of messages.")
    chars = 0
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request("Each message must be an object with a string 'role'.")
        chars += _content_chars(message.get("content"))
    return _tokens_of(chars) + CHAT_TOKENS_PER_MESSAGE * len(messages)


def _prompt_text(body: dict[str, Any], *, chat: bool) -> str:
    """The prompt as one text for the prefix cache: a chat's messages in order, each behind
    a role marker (a chat template's), so a conversation's next turn shares its blocks."""
    if not chat:
        prompt = body["prompt"]  # validated by _completion_prompt_tokens
        return prompt if isinstance(prompt, str) else str(prompt[0])
    parts = []
    for message in body["messages"]:  # validated by _chat_prompt_tokens
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        parts.append(f"<|{message['role']}|>{content if isinstance(content, str) else ''}")
    return "".join(parts)


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return 0


def _prompt_ids(body: dict[str, Any]) -> tuple[int, ...] | None:
    """A completion's prompt given as token ids (one prompt), else None."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        return tuple(prompt)
    return None


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return _tokens_of(len(prompt))
    raise bad_request("'prompt' must be a non-empty string or list of token ids (one prompt).")


def _tokens_of(chars: int) -> int:
    return max(1, -(-chars // CHARS_PER_TOKEN))


def _max_tokens(body: dict[str, Any], *, chat: bool) -> int | None:
    name = "max_tokens"
    value = body.get(name)
    if chat and body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"  # vLLM prefers it over the deprecated max_tokens
        value = body[name]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{name}' must be an integer of at least 1, got {value!r}.", name)
    return value


def _output_length(
    prompt_tokens: int, requested: int | None, profile: SimProfile
) -> tuple[int, str]:
    limit = profile.max_model_len
    if prompt_tokens >= limit:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your request "
            f"has {prompt_tokens} input tokens. Please reduce the length of the input.",
            "input_tokens",  # vLLM's name for it, though no request field has it
        )
    room = limit - prompt_tokens
    if requested is None:
        out = min(profile.default_output_tokens, room)
        return out, "stop" if out == profile.default_output_tokens else "length"
    if requested > room:
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
            f"maximum context length is {limit} tokens and your request has {prompt_tokens} "
            f"input tokens ({requested} > {limit} - {prompt_tokens}).",
            "max_tokens",  # vLLM's, for max_completion_tokens too
        )
    return requested, "length"


def _priority(body: dict[str, Any]) -> int:
    # Any integer, whatever the policy: vLLM 0.32 takes a priority without
    # --scheduling-policy priority and ignores it (its V0 engine refused one, "Got priority
    # 1 but Priority scheduling is not enabled."; V1 has no such check).
    value = body.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'priority' must be an integer, got {value!r}.")
    return value


def _response_id(body: dict[str, Any], *, chat: bool) -> str:
    prefix = "chatcmpl" if chat else "cmpl"
    request_id = body.get("request_id")
    if isinstance(request_id, str) and request_id:
        return f"{prefix}-{request_id}"
    return f"{prefix}-{secrets.token_hex(8)}"
