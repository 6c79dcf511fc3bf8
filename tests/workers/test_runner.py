"""The worker's payload handling (pure): splicing in the engine priority as bytes; which
attempts count as resumed."""

from __future__ import annotations

from typing import cast

import orjson
from prometheus_client import REGISTRY

from broker import Claimed, RequestKind, Settings, StreamMode, WrittenEntry
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
