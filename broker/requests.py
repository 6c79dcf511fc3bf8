"""Validating OpenAI request bodies and turning them into the payload an engine gets.

Only what fairq needs is checked here (model, messages or prompt, stream, token
limits); which other fields a request may carry is its model's (``broker.engine_fields``),
and those pass through to the engine untouched, except fairq's own (``user``,
``priority``, ``service_tier``), which stay inside fairq. A body is parsed
once, where it is read (``parse_json``), and refused there if it nests deeper than
``MAX_DEPTH``: fairq serialises it again for the engine, and a body that parses but
cannot be serialised again would fail downstream, after it was accepted.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from broker.errors import InvalidRequest
from broker.jobs import RequestKind, StreamMode
from broker.settings import ModelConfig


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    model: str = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    user: str | None = None
    # OpenAI's tier, one of the ``service_tiers`` setting (broker.tiers); never sent on.
    service_tier: str | None = None
    # engine_payload merges into it: anything but an object would fail there, not here.
    stream_options: dict[str, Any] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    # Text, or OpenAI's list of content parts; null for an assistant turn with tool calls.
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionBody(_Body):
    prompt: str | list[str] | list[int] | list[list[int]]


class EmbeddingBody(_Body):
    # One text, several, or token ids; an empty list embeds nothing and is refused here.
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str | None = None
    dimensions: int | None = Field(default=None, ge=1)

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: object) -> object:
        if value in ([], ""):
            raise ValueError("input must not be empty")
        return value


class ResponseBody(_Body):
    # A text, or the Responses API's list of input items (messages, tool outputs, ...).
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)


_SCHEMAS: dict[RequestKind, type[_Body]] = {
    RequestKind.CHAT: ChatBody,
    RequestKind.COMPLETION: CompletionBody,
    RequestKind.EMBEDDING: EmbeddingBody,
    RequestKind.RESPONSE: ResponseBody,
}


def _refusal(exc: ValidationError, body: dict[str, Any]) -> InvalidRequest:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    message = f"invalid request body at '{where}': {first['msg']}"
    return InvalidRequest(message, param=field_name(first, body))


def field_name(error: ErrorDetails, body: object) -> str | None:
    """OpenAI's ``param`` for a validation error: the path of the field at fault, lists'
    indexes in brackets (``messages.[0].content``).

    Only the part of the error's location that is in the body counts: pydantic adds the
    member of a union it tried (``prompt.list[str]``), which is not a field. A missing
    field is the last step of its location, under an object that lacks it.
    """
    loc, parts, value = error["loc"], [], body
    for index, step in enumerate(loc):
        if isinstance(step, str) and isinstance(value, dict) and step in value:
            parts.append(step)
            value = value[step]
        elif isinstance(step, int) and isinstance(value, list) and 0 <= step < len(value):
            parts.append(f"[{step}]")
            value = value[step]
        else:
            if error["type"] == "missing" and index == len(loc) - 1 and isinstance(value, dict):
                parts.append(str(step))
            break
    return ".".join(parts) or None


# Levels of JSON nesting a body may have. orjson parses up to 1,024 but serialises at
# most 254, and fairq serialises every body again (engine_payload, estimate_cost); real
# OpenAI bodies (tool schemas included) nest a few tens of levels at most.
MAX_DEPTH = 128
_Container = dict[Any, Any] | list[Any]  # what nests


def parse_json(raw: bytes, what: str = "request body") -> object:
    """A JSON document that fairq can serialise again; InvalidRequest otherwise."""
    value = _loads(raw, what)
    check_depth(value, what)
    return value


def _loads(raw: bytes, what: str) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"{what} is not valid JSON: {exc}") from exc


def check_depth(value: object, what: str = "request body") -> None:
    """Refuse a document nested deeper than ``MAX_DEPTH`` levels."""
    if nests_deeper_than(value, MAX_DEPTH):
        raise InvalidRequest(
            f"{what} nests JSON more than {MAX_DEPTH} levels deep; fairq accepts at most "
            f"{MAX_DEPTH} levels of objects and arrays"
        )


def nests_deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` has more than ``limit`` levels of dicts and lists (iterative:
    no recursion limit of its own)."""
    stack: list[tuple[_Container, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def parse_body(kind: RequestKind, raw: bytes) -> dict[str, Any]:
    """Parse and check a request body (its depth once, in ``check_body``); raises
    InvalidRequest with a readable reason."""
    return check_body(kind, _loads(raw, "request body"))


def check_body(kind: RequestKind, body: object) -> dict[str, Any]:
    """Check a parsed body against its kind's schema (and its depth: a batch line's body
    comes here parsed by the line's own reader)."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    check_depth(body)
    try:
        _SCHEMAS[kind].model_validate(body)
    except ValidationError as exc:
        raise _refusal(exc, body) from exc
    return body


def engine_payload(
    body: dict[str, Any], job_id: str, model: ModelConfig, kind: RequestKind = RequestKind.CHAT
) -> bytes:
    """The exact bytes the worker will POST to the engine for this job (``kind``: chat and
    completions are alike here).

    vLLM takes ``request_id``, so its completion ids become ``chatcmpl-<job id>`` (a
    response's, which vLLM uses as it is, ``resp_<job id>``) and chunks pass through
    unchanged. Chat and completions streams always ask for usage, which the worker needs
    for accounting; it drops the usage chunk again if the client did not ask (a Responses
    stream always ends with its usage, in ``response.completed``). A response is not
    stored by the engine unless the model allows ``store`` (``broker.engine_fields``):
    vLLM stores by default, in one replica's memory, where fairq's next request of the
    conversation may not land.
    """
    payload = dict(body)
    payload.pop("user", None)  # the fairness identity stays inside fairq
    payload.pop("priority", None)  # a key never sets its own engine priority: fairq does
    payload.pop("service_tier", None)  # fairq's band (broker.tiers); vLLM takes no such field
    if model.engine == "vllm":
        payload["request_id"] = f"resp_{job_id}" if kind is RequestKind.RESPONSE else job_id
    if kind is RequestKind.RESPONSE:
        payload.setdefault("store", False)
    if not kind.generates:
        return orjson.dumps(payload)
    if stream_mode(body, model) is StreamMode.WHOLE:
        payload["stream"] = True  # the worker rebuilds the whole answer (workers.whole)
    if payload.get("stream"):
        options = dict(payload.get("stream_options") or {})
        options["include_usage"] = True
        payload["stream_options"] = options
    return orjson.dumps(payload)


def token_estimate(
    body: dict[str, Any], default_output: int, kind: RequestKind = RequestKind.CHAT
) -> tuple[int, int]:
    """A request's prompt and output tokens as far as they can be known before it runs:
    its prompt (messages, prompt, or a response's or embedding's input and instructions) at
    ~4 characters a token (no tokenizer here); its output at the maximum it asks for, else
    ``default_output``; an embedding has no output."""
    if kind is RequestKind.EMBEDDING:
        return max(1, len(orjson.dumps(body.get("input") or "")) // 4), 0
    if kind is RequestKind.RESPONSE:
        prompt: object = [body.get("instructions") or "", body.get("input") or ""]
        output = body.get("max_output_tokens")
    else:
        prompt = body.get("messages") or body.get("prompt") or ""
        output = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(output, int):
        output = default_output
    return max(1, len(orjson.dumps(prompt)) // 4), output


def estimate_tokens(
    body: dict[str, Any], model: ModelConfig, kind: RequestKind = RequestKind.CHAT
) -> int:
    """A request's tokens as far as they can be known before it runs (unweighted), charged
    to its quotas (``broker.quotas``): ``token_estimate``'s prompt and output."""
    return sum(token_estimate(body, model.default_output_tokens, kind))


def estimate_cost(
    body: dict[str, Any], model: ModelConfig, kind: RequestKind = RequestKind.CHAT
) -> float:
    """The job's service in weighted tokens, as far as it can be known before it runs
    (``token_estimate``). The dispatcher corrects the charge to actual usage later."""
    prompt_tokens, output = token_estimate(body, model.default_output_tokens, kind)
    return prompt_tokens * model.prompt_token_cost + output * model.output_token_cost


# Request fields whose output cannot be continued where it was cut: several choices, tool
# calls and constrained output (a grammar restarted mid-way), echoed or scored prompts, log
# probabilities (their offsets would start again), stop strings (the engine holds back text
# that may begin one: a continuation from the token ids would never send it), usage in
# every chunk (it would count the continuation alone), and token ids the client asked for
# itself (the worker asks for them, and takes them out of what the client gets). A byte
# search: a prompt that merely mentions one of these only costs the job its resume.
_NOT_RESUMABLE = (
    b'"n":',
    b'"tools"',
    b'"functions"',
    b'"response_format"',
    b'"guided_',
    b'"echo"',
    b'"best_of"',
    b'"structured_outputs"',
    b'"prompt_logprobs"',
    b'"prompt":[',
    b'"return_token_ids"',
    b'"stop":"',
    b'"stop":["',
    b'"top_logprobs"',
    b'"continuous_usage_stats":true',
)
_LOGPROBS = re.compile(rb'"logprobs":(?!null|false)')


def resumable(payload: bytes) -> bool:
    """Whether a streamed job taken back out of the engine mid-answer may go on later where
    it was cut (from its prompt's and answer's token ids, ``workers.resume_exact``, or from
    its text, ``workers.resume``), rather than stay in the engine to its end."""
    return not any(mark in payload for mark in _NOT_RESUMABLE) and not _LOGPROBS.search(payload)


# The request fields with which the answer the engine streams is the whole answer, chunk by
# chunk, so that the worker can rebuild it (``workers.whole``): text and finish reasons,
# and the sampling, length and format options that shape them. A request with any other
# field (tools, log probabilities, echo, best_of, token ids, a field unknown here) goes to
# the engine as its client sent it, not streamed. Which fields may reach the engine at all
# is another question, the model's (broker.engine_fields): these only shape how an answer
# travels, and most of them pass only where a model's allow_fields lists them.
WHOLE_FIELDS = frozenset(
    {
        "model", "messages", "prompt", "user", "stream", "n", "request_id",
        "max_tokens", "max_completion_tokens", "min_tokens", "ignore_eos", "stop",
        "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
        "spaces_between_special_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty",
        "logit_bias", "bad_words", "allowed_token_ids", "response_format",
        "structured_outputs", "guided_json", "guided_regex", "guided_choice",
        "guided_grammar", "add_generation_prompt", "continue_final_message",
        "add_special_tokens", "chat_template", "chat_template_kwargs", "reasoning_effort",
        "truncate_prompt_tokens", "cache_salt", "metadata", "service_tier",
    }
)  # fmt: skip


def stream_mode(
    body: dict[str, Any], model: ModelConfig, kind: RequestKind = RequestKind.CHAT
) -> StreamMode:
    """How the job's answer travels: to its client as asked; one its client wants whole is
    streamed from the engine where the model says so and the worker can rebuild it (chat
    and completions only). An embedding is always one body; a Responses stream always
    ends with its usage, so it never asks for the usage chunk."""
    if not kind.generates:
        return StreamMode.STREAMED if body.get("stream") else StreamMode.PLAIN
    if body.get("stream"):
        return StreamMode.WITH_USAGE if wants_usage(body) else StreamMode.STREAMED
    if model.stream_from_engine and body.get("n", 1) == 1 and WHOLE_FIELDS.issuperset(body):
        return StreamMode.WHOLE
    return StreamMode.PLAIN


def wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))
