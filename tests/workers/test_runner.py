"""The worker's payload handling (pure): splicing in the engine priority as bytes; which
attempts count as resumed; an answer that was whole when taken back."""

from __future__ import annotations

from typing import cast

import orjson
from prometheus_client import REGISTRY

from broker import (
    Claimed,
    JobState,
    Outcome,
    RequestKind,
    Settings,
    StreamMode,
    TokenTrail,
    WrittenEntry,
)
from workers.attempt import Attempt
from workers.engine_http import EngineClient
from workers.runner import JobRunner, with_priority
from workers.writer import ResultWriter


def test_priority_is_spliced_into_the_json_object() -> None:
    payload = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "{x}"}]})
    spliced = orjson.loads(with_priority(payload, 1_000_003))
    assert spliced == {"priority": 1_000_003, **orjson.loads(payload)}


def test_an_empty_object_gets_just_the_priority() -> None:
    assert orjson.loads(with_priority(b"{}", 0)) == {"priority": 0}


def test_no_priority_leaves_the_payload_untouched() -> None:
    payload = b'{"model":"m"}'
    assert with_priority(payload, None) is payload


async def test_a_job_taken_back_before_its_first_output_is_not_counted_as_resumed() -> None:
    async def nothing_written(job: Claimed) -> list[WrittenEntry]:
        return []

    job = Claimed("m", b"1-0", "j", b'{"stream":true}', RequestKind.CHAT, StreamMode.STREAMED,
                  "http://e:8000", "default", "alice", resume_gen=1)  # fmt: skip
    runner = JobRunner(cast(ResultWriter, None), cast(EngineClient, None), Settings(),
                       nothing_written)  # fmt: skip
    before = [_resumes(how) for how in ("exact", "text")]
    plan = await runner._attempt(job)
    assert isinstance(plan, Attempt) and plan.earlier is None  # it starts afresh
    assert [_resumes(how) for how in ("exact", "text")] == before


def _resumes(how: str) -> float:
    return REGISTRY.get_sample_value("fairq_worker_resumes_total", {"how": how}) or 0.0


async def test_an_answer_whole_before_its_usage_chunk_gets_it_and_completes() -> None:
    """Taken back between its last token and its usage chunk: the runner writes the usage
    chunk its client asked for (``resume_exact.owed_usage``) and ends the job completed."""
    head = (
        b'data: {"id":"c-1","object":"chat.completion.chunk","created":5,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":"length"}]}\n\n'
    )

    async def whole_written(job: Claimed) -> list[WrittenEntry]:
        return [WrittenEntry(head, TokenTrail(b"7", b"1,2,3"))]

    class Chunks:
        written: list[bytes] = []

        def chunk(self, job: Claimed, data: bytes, **_: object) -> None:
            self.written.append(data)

    job = Claimed("m", b"1-0", "j", b'{"stream":true,"max_tokens":1}', RequestKind.CHAT,
                  StreamMode.WITH_USAGE, "http://e:8000", "default", "alice", resume_gen=1,
                  track_tokens=True)  # fmt: skip
    writer = Chunks()
    runner = JobRunner(cast(ResultWriter, writer), cast(EngineClient, None), Settings(),
                       whole_written)  # fmt: skip
    outcome = await runner.run(job)
    assert isinstance(outcome, Outcome) and outcome.state is JobState.COMPLETED
    assert outcome.usage == {"completion_tokens": 1}
    [usage] = writer.written
    assert orjson.loads(usage.removeprefix(b"data: "))["usage"] == {
        "prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1
    }  # fmt: skip
