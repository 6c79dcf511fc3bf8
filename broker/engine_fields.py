"""Which fields of a request may reach the engine: OpenAI's, and those its model allows.

fairq sends a request's body on to the engine, and engines read much more than
OpenAI's fields. vLLM renders a request's own ``chat_template`` (Jinja: request-supplied
templates have had denial-of-service advisories), hands ``mm_processor_kwargs`` to the
model's processor, loads the ``logits_processors`` a request names, steers
disaggregated serving by ``kv_transfer_params``; the simulator obeys ``sim_fault``. Any
client with a key could ask the engine for any of them. So a body may hold only:

* OpenAI's fields of its kind (``OPENAI_FIELDS``), as OpenAI's chat, completions,
  embeddings and Responses references list them: sampling, length, stop, log
  probabilities, output format, tools, streaming. An engine reads each as OpenAI does,
  or ignores it. Left out are the fields that ask a server for more than generating
  (``store`` and ``metadata``: OpenAI's stored completions; ``web_search_options``: a
  search the server runs; ``audio``, ``modalities``, ``prediction``; the prompt cache's
  and safety identifiers; on the
  Responses API the state a server keeps: ``previous_response_id``, ``conversation``,
  ``background``, ``store`` unless it is false, which is how fairq sends every response:
  vLLM keeps a stored response in one replica's memory, where the conversation's next
  request, queued by fairq, may not land. A model with one endpoint and its engine's
  store on may list ``store`` and ``previous_response_id`` in ``allow_fields``);
* fairq's own, on every kind (``FAIRQ_FIELDS``): ``service_tier``, read as the band
  (``broker.tiers``), and ``priority``, dropped (``broker.requests.engine_payload``).
  ``user``, OpenAI's, is read too; none of the three is sent on;
* those the model's ``allow_fields`` setting lists (vLLM's ``top_k``, ``min_p``,
  ``ignore_eos``; the simulator's ``sim_fault`` in fairq's tests).

A body with any other field is refused before a job is made (400
``invalid_request_error``, ``field_not_allowed``, ``param`` the field): at the gateway,
in the Python client, and on a batch line, which fails alone. Only a body's top-level
fields are checked: what nests inside one (a message's content parts, the members of
``stream_options``) is the engine's to refuse. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.errors import InvalidRequest
from broker.jobs import RequestKind
from broker.settings import ModelConfig

# The fields both kinds share (OpenAI's chat and completions references).
_SHARED = frozenset(
    {
        "model", "stream", "stream_options", "max_tokens", "n", "temperature", "top_p",
        "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
        "user",
    }
)  # fmt: skip
_CHAT = frozenset(
    {
        "messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
        "tool_choice", "parallel_tool_calls", "functions", "function_call",
        "reasoning_effort", "verbosity",
    }
)  # fmt: skip
_COMPLETION = frozenset({"prompt", "echo", "suffix", "best_of"})
# OpenAI's embeddings reference: all of it.
_EMBEDDING = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
# OpenAI's Responses reference, less what a server keeps or runs for the client: stored
# responses and conversations (``previous_response_id``, ``conversation``, ``store``
# unless false, ``metadata``), ``background`` (a job the server runs: fairq is the queue),
# stored prompt templates (``prompt``), the prompt cache's and safety identifiers.
_RESPONSE = frozenset(
    {
        "model", "input", "instructions", "max_output_tokens", "max_tool_calls", "stream",
        "temperature", "top_p", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
        "text", "reasoning", "truncation", "include", "user",
    }
)  # fmt: skip
# fairq's own, on every kind: the band a request asks for, and the engine priority a
# key may not set itself.
FAIRQ_FIELDS = frozenset({"service_tier", "priority"})

OPENAI_FIELDS: Mapping[RequestKind, frozenset[str]] = {
    RequestKind.CHAT: _SHARED | _CHAT,
    RequestKind.COMPLETION: _SHARED | _COMPLETION,
    RequestKind.EMBEDDING: _EMBEDDING,
    RequestKind.RESPONSE: _RESPONSE,
}
# Fields allowed with one value only: ``store: false`` asks the server to keep nothing,
# which is what fairq makes every response ask (``broker.requests.engine_payload``);
# coding agents send it so.
ONLY_VALUE: Mapping[RequestKind, Mapping[str, object]] = {RequestKind.RESPONSE: {"store": False}}

_KIND_NAMES = {
    RequestKind.CHAT: "chat completions",
    RequestKind.COMPLETION: "completions",
    RequestKind.EMBEDDING: "embeddings",
    RequestKind.RESPONSE: "Responses API",
}
_NAMED = 3  # fields a refusal names; it counts the rest
_NAME_CHARS = 64  # of a field's name, as a refusal repeats it


def check_fields(kind: RequestKind, body: Mapping[str, object], model: ModelConfig) -> None:
    """Raise InvalidRequest unless every field of ``body`` may reach ``model``'s engine."""
    allowed, only = OPENAI_FIELDS[kind], ONLY_VALUE.get(kind, {})
    refused = [
        name
        for name in body
        if name not in allowed
        and name not in FAIRQ_FIELDS
        and name not in model.allow_fields
        and not (name in only and body[name] is only[name])
    ]
    if refused:
        raise InvalidRequest(
            _refusal(refused, kind, model.name), code="field_not_allowed", param=_shown(refused[0])
        )


def _refusal(refused: list[str], kind: RequestKind, model: str) -> str:
    names = ", ".join(repr(_shown(name)) for name in refused[:_NAMED])
    if len(refused) > _NAMED:
        names += f" and {len(refused) - _NAMED} more"
    one = len(refused) == 1
    what, them = ("field", "it") if one else ("fields", "them")
    return (
        f"the request {what} {names} {'is' if one else 'are'} not allowed for model "
        f"{model!r}: fairq sends an engine only OpenAI's {_KIND_NAMES[kind]} fields and "
        f"those the model's allow_fields setting lists; remove {them}, or ask the "
        f"operator to add {them} to the model's allow_fields"
    )


def _shown(name: str) -> str:
    return name if len(name) <= _NAME_CHARS else name[:_NAME_CHARS] + "..."
