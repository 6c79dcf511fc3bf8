"""``POST /v1/embeddings`` as vLLM serves it for a pooling model: one vector per input.

A vector follows from its input alone (a hash of it, normalised to length 1), so the same
text gets the same vector on every pod and every run; ``dimensions`` sets its length (else
``EMBEDDING_DIMENSIONS``). ``encoding_format: base64`` packs it as little-endian float32,
as vLLM does and as the official openai client asks by default. Each input is one prefill
in the engine (a sequence of one step), so embeddings take slots and show in the metrics
as generation does. Usage counts prompt tokens only.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import time
from dataclasses import dataclass
from typing import Any

import orjson

from sim._engine import Engine, SimSequence
from sim._parsing import CHARS_PER_TOKEN, bad_request, json_object, model_of
from sim._responses import JsonCompletionResponse
from sim._wire import ResponseMeta

EMBEDDING_DIMENSIONS = 8
_MAX_DIMENSIONS = 4096


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    dimensions: int
    base64: bool
    request_id: str | None

    @property
    def prompt_tokens(self) -> int:
        return sum(_tokens(one) for one in self.inputs)


def parse_embedding(raw: bytes, models: list[str]) -> EmbeddingRequest:
    body = json_object(raw)
    model = model_of(body, models)
    dimensions = body.get("dimensions") or EMBEDDING_DIMENSIONS
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise bad_request(f"'dimensions' must be an integer, got {dimensions!r}.", "dimensions")
    if not 1 <= dimensions <= _MAX_DIMENSIONS:
        raise bad_request(f"'dimensions' must be 1 to {_MAX_DIMENSIONS}.", "dimensions")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise bad_request(f"'encoding_format' must be float or base64, not {encoding!r}.")
    request_id = body.get("request_id")
    return EmbeddingRequest(
        model=model,
        inputs=_inputs(body.get("input")),
        dimensions=dimensions,
        base64=encoding == "base64",
        request_id=request_id if isinstance(request_id, str) and request_id else None,
    )


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(value, str) and value:
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, list) and value and all(_is_id(v) for v in value):
        return (tuple(value),)
    if isinstance(value, list) and value and all(_ids(v) for v in value):
        return tuple(tuple(v) for v in value)
    raise bad_request("'input' must be a text, a list of texts or of token ids.", "input")


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_id(v) for v in value)


def _tokens(one: str | tuple[int, ...]) -> int:
    return len(one) if isinstance(one, tuple) else max(1, -(-len(one) // CHARS_PER_TOKEN))


def vector(one: str | tuple[int, ...], dimensions: int) -> list[float]:
    """The input's vector: hash-derived, of length 1."""
    seed = orjson.dumps(one)
    raw: list[float] = []
    block = 0
    while len(raw) < dimensions:
        digest = hashlib.sha256(seed + b"#%d" % block).digest()
        raw.extend(b / 127.5 - 1.0 for b in digest)
        block += 1
    raw = raw[:dimensions]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def embedding_body(req: EmbeddingRequest) -> bytes:
    """vLLM's answer: an OpenAI list of embeddings, with usage."""
    data = []
    for index, one in enumerate(req.inputs):
        values = vector(one, req.dimensions)
        encoded: list[float] | str = values
        if req.base64:
            encoded = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
        data.append({"index": index, "object": "embedding", "embedding": encoded})
    prompt = req.prompt_tokens
    return orjson.dumps(
        {
            "id": f"embd-{req.request_id or hashlib.sha256(repr(req).encode()).hexdigest()[:16]}",
            "object": "list",
            "created": int(time.time()),
            "model": req.model,
            "data": data,
            "usage": {
                "prompt_tokens": prompt,
                "total_tokens": prompt,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }
    )


class EmbeddingJson(JsonCompletionResponse):
    """The embeddings once their prefill (one engine sequence) finishes."""

    def __init__(
        self, engine: Engine, seq: SimSequence, meta: ResponseMeta, req: EmbeddingRequest
    ) -> None:
        super().__init__(engine, seq, meta, chat=False)
        self._req = req

    def _render(self, generated: int) -> bytes:
        return embedding_body(self._req)
