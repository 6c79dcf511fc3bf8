"""Recording an answer's token ids as it streams, so that it can be resumed exactly (pure).

A streamed job that preemption may take back mid-answer (its ready entry's ``tk``) asks
vLLM for token ids (``return_token_ids``): the first event then carries the prompt's
(``prompt_token_ids``: at the top of a chat chunk, in the choice of a completion's) and
every event the ids of its own tokens (``token_ids``). The client asked for none of that,
so the worker takes the lists out and leaves ``null`` where they were: exactly the bytes
vLLM sends without ``return_token_ids``. The ids go into the result entry beside the
events (``broker.TokenTrail``): one group per event, ``;`` between groups, ``,`` within.

This runs for every token of such a job, so it works on bytes: a substring test, then a
search and a substitution done in C, no JSON parsing. vLLM's JSON has no spaces
(pydantic's ``model_dump_json``), and the name ``"token_ids"`` with its opening quote
cannot match inside ``"prompt_token_ids"``.
"""

from __future__ import annotations

import re

from broker import TokenTrail

_PROMPT_MARK = b'"prompt_token_ids":['
_PROMPT_IDS = re.compile(rb'"prompt_token_ids":\[([0-9,]*)\]')
_IDS = re.compile(rb'"token_ids":\[([0-9,]*)\]')
_NO_PROMPT_IDS = b'"prompt_token_ids":null'
_NO_IDS = b'"token_ids":null'


def asking_token_ids(payload: bytes) -> bytes:
    """The payload with ``"return_token_ids":true``, spliced in as bytes (no JSON rebuild).

    A payload that named the field itself is never resumable (``broker.requests``), so
    the member is not there twice.
    """
    member = b'"return_token_ids":true'
    return b"{" + member + (b"," if payload.strip() != b"{}" else b"") + payload.lstrip()[1:]


def take_token_ids(events: bytes) -> tuple[bytes, TokenTrail]:
    """The events as the client gets them (the id lists as ``null``), and their ids."""
    prompt = b""
    if _PROMPT_MARK in events:
        found = _PROMPT_IDS.search(events)
        if found is not None:
            prompt = found.group(1)
            events = _PROMPT_IDS.sub(_NO_PROMPT_IDS, events, count=1)
    groups = _IDS.findall(events)
    if groups:
        events = _IDS.sub(_NO_IDS, events)
    return events, TokenTrail(b";".join(groups), prompt)


def parse_ids(text: bytes) -> list[int]:
    """``b"1,2,3"`` as ids (an empty text: none)."""
    return [int(part) for part in text.split(b",")] if text else []


def parse_groups(text: bytes) -> list[list[int]]:
    """``b"1,2;3"`` as one id list per event (an empty text: no event)."""
    return [parse_ids(group) for group in text.split(b";")] if text else []
