"""Answers their clients want whole, streamed from the engine (``StreamMode.WHOLE``), with
real processes: the client gets one body with every token once, and fairq sees the job's
first token when it comes, not when the answer ends."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from broker import Client
from fairq.stack.processes import DEMO_MODELS
from sim._wire import WORDS, output_text
from tests.support.settings import make_settings
from tests.support.stack import demo_stack

pytestmark = pytest.mark.integration

STEP_MS = 8.0
TOKENS = 150  # ~1.2 s of answer after its first token


@pytest.mark.parametrize("stream_from_engine", [True, False])
def test_a_whole_answer_is_one_body_and_its_first_token_is_seen_as_it_comes(
    redis_url: str, tmp_path: Path, stream_from_engine: bool
) -> None:
    profile = tmp_path / "engine.yaml"
    profile.write_text(yaml.safe_dump({"step_base_ms": STEP_MS, "step_per_seq_ms": 0.0}))
    model = DEMO_MODELS[0]
    with demo_stack(
        per_model={model: {"stream_from_engine": stream_from_engine}},
        profile=profile,
        redis_url=redis_url,
        gateway=False,
    ) as stack:
        settings = make_settings(redis_url, **stack.config)
        with Client(settings, api_key="fq-demo-alice") as alice:
            job_id = alice.submit(
                model, messages=[{"role": "user", "content": "hi"}], max_tokens=TOKENS
            )
            body = alice.result(job_id)
            job = alice.status(job_id)
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    text = choice["message"]["content"]
    assert any(output_text(seed, TOKENS) == text for seed in range(len(WORDS))), text[:200]
    assert body["usage"]["completion_tokens"] == TOKENS
    assert job.stream is False  # the client's view: one body
    assert job.first_token_ms is not None and job.ended_ms is not None
    after_first_ms = job.ended_ms - job.first_token_ms
    if stream_from_engine:  # the first token came as the answer began
        assert after_first_ms > TOKENS * STEP_MS / 2, after_first_ms
    else:  # not seen before the whole answer came
        assert after_first_ms < TOKENS * STEP_MS / 4, after_first_ms
