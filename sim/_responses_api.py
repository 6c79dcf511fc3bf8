"""``POST /v1/responses`` as vLLM serves it: the Responses API over the same engine.

The request becomes the chat request it amounts to (``instructions`` a system message,
``input`` a text or a list of input items, each message's text parts joined), so its
answer is the chat answer's words. Whole, it is one ``response`` object; streamed, vLLM's
named events (``event: <type>`` and one ``data:`` line, no ``[DONE]``): created,
in_progress, output_item.added, content_part.added, one output_text.delta per token,
output_text.done, content_part.done, output_item.done, completed (or incomplete, at the
length limit), each with its ``sequence_number``. Usage is ``input_tokens`` and
``output_tokens``. The response id is vLLM's ``request_id`` as it is (fairq sends
``resp_<job id>``). No faults are injected here.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

import orjson
from starlette.types import Send

from sim._engine import Engine, SimSequence
from sim._parsing import GenRequest, bad_request, json_object, parse_request
from sim._profile import SimProfile
from sim._responses import EngineResponse, JsonCompletionResponse
from sim._scheduler import SeqStatus
from sim._tokens import word_index
from sim._wire import WORDS, ResponseMeta, output_text

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]


def parse_responses(raw: bytes, models: list[str], profile: SimProfile) -> GenRequest:
    """The Responses request as the generation it asks for (its id: the response's)."""
    body = json_object(raw)
    chat: dict[str, Any] = {"messages": _messages(body), "stream": body.get("stream") is True}
    for name in ("model", "priority"):
        if name in body:
            chat[name] = body[name]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    req = parse_request(orjson.dumps(chat), chat=True, models=models, profile=profile)
    request_id = body.get("request_id")
    if not (isinstance(request_id, str) and request_id):
        request_id = f"resp_{secrets.token_hex(8)}"
    return dataclasses.replace(req, id=request_id, include_usage=False)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("'input' must be a text or a non-empty list of items.", "input")
    for item in items:
        if not isinstance(item, dict):
            raise bad_request("Each input item must be an object.", "input")
        content = item.get("content") or item.get("output") or ""
        if isinstance(content, list):
            content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        messages.append({"role": str(item.get("role") or "user"), "content": str(content)})
    return messages


def _response(meta: ResponseMeta, req: GenRequest, generated: int, *, done: bool) -> dict[str, Any]:
    """vLLM's ``response`` object: in progress (no output yet) or ended."""
    status = "in_progress"
    incomplete = None
    output: list[dict[str, Any]] = []
    usage = None
    if done:
        status = "incomplete" if meta.finish_reason == "length" else "completed"
        if status == "incomplete":
            incomplete = {"reason": "max_output_tokens"}
        output = [_message(meta, output_text(meta.seed, generated), "completed")]
        usage = {
            "input_tokens": meta.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": meta.prompt_tokens + generated,
        }
    return {
        "id": meta.id,
        "created_at": meta.created,
        "incomplete_details": incomplete,
        "instructions": None,
        "metadata": None,
        "model": meta.model,
        "object": "response",
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "background": False,
        "max_output_tokens": req.max_tokens,
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "auto",
        "status": status,
        "text": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
    }


def _message(meta: ResponseMeta, text: str, status: str) -> dict[str, Any]:
    content = [] if not text and status != "completed" else [_part(text)]
    return {
        "id": _item_id(meta),
        "content": content,
        "role": "assistant",
        "status": status,
        "type": "message",
    }


def _part(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": []}


def _item_id(meta: ResponseMeta) -> str:
    return f"msg_{meta.id.removeprefix('resp_')}"


class ResponsesJson(JsonCompletionResponse):
    """The whole ``response`` once the sequence finishes."""

    def __init__(self, engine: Engine, seq: SimSequence, meta: ResponseMeta, req: GenRequest):
        super().__init__(engine, seq, meta, chat=True)
        self._req = req

    def _render(self, generated: int) -> bytes:
        return orjson.dumps(_response(self._meta, self._req, generated, done=True))


class ResponsesSse(EngineResponse):
    """vLLM's Responses events, one ``output_text.delta`` per token."""

    def __init__(self, engine: Engine, seq: SimSequence, meta: ResponseMeta, req: GenRequest):
        super().__init__(engine, seq, meta)
        self._req = req
        self._number = 0

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, **fields, "sequence_number": self._number}
        self._number += 1
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps(data))

    def _opening(self) -> bytes:
        meta, req = self._meta, self._req
        opened = _response(meta, req, 0, done=False)
        item = _message(meta, "", "in_progress")
        place = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._event("response.created", response=opened),
                self._event("response.in_progress", response=opened),
                self._event("response.output_item.added", output_index=0, item=item),
                self._event("response.content_part.added", **place, part=_part("")),
            )
        )

    def _deltas(self, start: int, stop: int) -> bytes:
        seed, item = self._meta.seed, _item_id(self._meta)
        return b"".join(
            self._event(
                "response.output_text.delta",
                item_id=item,
                output_index=0,
                content_index=0,
                delta=WORDS[word_index(seed, i, len(WORDS))],
                logprobs=[],
            )
            for i in range(start, stop)
        )

    def _closing(self, generated: int) -> bytes:
        meta, req = self._meta, self._req
        text = output_text(meta.seed, generated)
        place = {"item_id": _item_id(meta), "output_index": 0, "content_index": 0}
        ended = _response(meta, req, generated, done=True)
        last = "response.completed" if ended["status"] == "completed" else "response.incomplete"
        return b"".join(
            (
                self._event("response.output_text.done", **place, text=text, logprobs=[]),
                self._event("response.content_part.done", **place, part=_part(text)),
                self._event("response.output_item.done", output_index=0, item=ended["output"][0]),
                self._event(last, response=ended),
            )
        )

    async def _respond(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        seq, sent = self._seq, 0
        await send({"type": "http.response.body", "body": self._opening(), "more_body": True})
        while True:
            await seq.wakeup.wait()
            seq.wakeup.clear()
            if seq.status is SeqStatus.ABORTED:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            body = self._deltas(sent, seq.generated)
            sent = seq.generated
            if seq.status is SeqStatus.FINISHED:
                body += self._closing(sent)
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
