"""fairq's own preemptions in an arm, and whether every answer it resumed came out whole.

After the flood, the arm's Redis still holds every job and its result stream. Jobs taken
back out of the engine carry 'pk' (times); those taken back mid-answer also 'pkm'. Each
of those answers is read back as its client got it, with the token ids its workers
recorded (``workers.resume_exact``), and checked:

- its chunks say one id and one ``created``, and one role chunk opens it;
- its usage counts the tokens generated once: ``completion_tokens`` is the number of
  ids recorded (the tokens an earlier attempt's text had not shown and a later attempt
  generated again are counted once: ``td``);
- its text is the text of those ids, so no token came twice and none went missing: on
  the simulator, one walk of its word list (an answer is a function of its positions,
  ``sim/_tokens.py``); on a real vLLM, the text vLLM's incremental detokenizer
  streams for those ids after that prompt when nothing cuts the answer (by vLLM's own
  python: fairq's has no tokenizer). An engine at ``--engine-url`` gets the first two
  checks only.

The load client cannot do this during the flood: parsing every event would take CPU from
the stack being measured.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from redis import Redis

from broker import keys
from broker.redis import replies
from broker.results import CHUNK_FIELD, PROMPT_TOKENS_FIELD, REDONE_FIELD, TOKENS_FIELD
from workers.token_ids import parse_groups, parse_ids

# The text streamed for each answer's (prompt ids, answer ids) (None: not checked here).
Decode = Callable[[Sequence[tuple[Sequence[int], Sequence[int]]]], list[str]] | None


@dataclass
class Answer:
    job_id: str
    chunks: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    seams: list[int] = field(default_factory=list)  # characters of text before each cut

    @property
    def text(self) -> str:
        return "".join(_content(c) for c in self.chunks)


def _content(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or [{}]
    return str((choices[0].get("delta") or {}).get("content") or choices[0].get("text") or "")


def read_answer(redis: Redis, model: str, job_id: str) -> Answer:
    """The answer as its client got it, and the token ids recorded with it."""
    answer = Answer(job_id)
    groups: list[list[int]] = []
    for _, fields in replies.entries(redis.xrange(keys.results(model, job_id))):
        if CHUNK_FIELD not in fields:
            answer.seams += [len(answer.text)] if b"pk" in fields else []
            continue
        answer.chunks += [
            orjson.loads(event[6:])
            for event in fields[CHUNK_FIELD].split(b"\n\n")
            if event.startswith(b"data: {")
        ]
        answer.prompt_ids = answer.prompt_ids or parse_ids(fields.get(PROMPT_TOKENS_FIELD, b""))
        del groups[len(groups) - int(fields.get(REDONE_FIELD) or 0) :]
        groups += parse_groups(fields.get(TOKENS_FIELD, b""))
    answer.ids = [token for group in groups for token in group]
    return answer


def whole(answer: Answer) -> str | None:
    """What is wrong with the answer's chunks and usage (None: nothing)."""
    roles = sum(
        1 for c in answer.chunks if c.get("choices") and "role" in c["choices"][0].get("delta", {})
    )
    usage = [c["usage"] for c in answer.chunks if c.get("usage")]
    if len({(c.get("id"), c.get("created")) for c in answer.chunks}) != 1:
        return "its chunks name more than one id or created"
    if roles != 1:
        return f"{roles} role chunks"
    if not answer.ids:
        return "no token ids were recorded"
    if usage and usage[-1]["completion_tokens"] != len(answer.ids):
        return (
            f"usage says {usage[-1]['completion_tokens']} tokens, {len(answer.ids)} were generated"
        )
    return None


def sim_text_problem(answer: Answer) -> str | None:
    """On the simulator: the text is one walk of its words from one start."""
    from sim import WORDS, output_text

    n = len(answer.ids)
    walks = [output_text(seed, n) for seed in range(len(WORDS))]
    if answer.text in walks:
        return None
    nearest = max(walks, key=lambda walk: _common(walk, answer.text))
    return (
        "its text is not one walk of the simulator's words: a token repeated or lost"
        f"{_where(answer.text, nearest)}; cut at characters {answer.seams}"
    )


def _common(a: str, b: str) -> int:
    """How many characters two texts share from their start."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def tokenizer_decode(vllm_python: Path, tokenizer: Path) -> Decode:
    """The text vLLM streams for each (prompt ids, answer ids) when nothing cuts the
    answer: its incremental detokenizer, as vLLM 0.32 runs it (the tokenizers library's
    ``DecodeStream`` primed with the prompt, special tokens skipped), by vLLM's own python.
    A text decoded whole can differ from it (an invalid byte sequence split otherwise)."""
    script = (
        "import json, sys; from tokenizers import Tokenizer; "
        "from tokenizers.decoders import DecodeStream; "
        "t = Tokenizer.from_file(sys.argv[1]); out = []\n"
        "for prompt, ids in json.load(sys.stdin):\n"
        "    s = DecodeStream(ids=prompt, skip_special_tokens=True)\n"
        "    out.append(''.join(s.step(t, i) or '' for i in ids))\n"
        "print(json.dumps(out))"
    )

    def decode(answers: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[str]:
        out = subprocess.run(
            [str(vllm_python), "-c", script, str(tokenizer)],
            input=json.dumps([[list(p), list(i)] for p, i in answers]), capture_output=True,
            text=True, check=True, timeout=120,
        )  # fmt: skip
        texts: list[str] = json.loads(out.stdout)
        return texts

    return decode


def problems(answers: Sequence[Answer], kind: str, decode: Decode) -> list[str]:
    """``job id: what is wrong`` for every answer that did not come out whole."""
    found = {a.job_id: whole(a) for a in answers}
    if kind == "sim":
        found = {a.job_id: found[a.job_id] or sim_text_problem(a) for a in answers}
    elif decode is not None and answers:
        texts = decode([(a.prompt_ids, a.ids) for a in answers])
        for answer, text in zip(answers, texts, strict=True):
            if found[answer.job_id] is None and text != answer.text:
                found[answer.job_id] = (
                    f"its text is not the text of its token ids{_where(answer.text, text)}; "
                    f"cut at characters {answer.seams}"
                )
    return [f"{job_id}: {why}" for job_id, why in found.items() if why is not None]


def _where(got: str, ids_text: str) -> str:
    """Where two texts part: the first differing character and a little around it."""
    at = _common(got, ids_text)
    start = max(0, at - 10)
    return f" (from character {at}: {got[start : at + 20]!r}, ids: {ids_text[start : at + 20]!r})"


def fairq_preemptions(redis_url: str, model: str, kind: str, decode: Decode) -> dict[str, Any]:
    """Times fairq took jobs back, the jobs taken back mid-answer, and what was wrong with
    any answer taken back: those resumed mid-answer, and those started again from scratch
    whose token ids were recorded (their client must see only the new attempt's)."""
    redis = Redis.from_url(redis_url)
    try:
        taken, resumed, restarted = 0, [], []
        for key in redis.scan_iter(keys.job(model, "*"), count=1000):
            pk, mid_answer = redis.hmget(key, ["pk", "pkm"])
            taken += int(pk or 0)
            job_id = key.decode().removeprefix(keys.job_prefix(model))
            if mid_answer is not None:
                resumed.append(job_id)
            elif pk is not None:
                restarted.append(job_id)
        answers = [read_answer(redis, model, job_id) for job_id in resumed]
        fresh = [read_answer(redis, model, job_id) for job_id in restarted]
    finally:
        redis.close()
    broken = problems(answers + [a for a in fresh if a.ids], kind, decode)
    return {"taken_back": taken, "mid_answer": len(resumed), "broken": len(broken),
            "first_broken": broken[0] if broken else None}  # fmt: skip
