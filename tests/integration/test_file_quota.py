"""The Files API's bounds through the official ``openai`` client against a real gateway and
Redis: uploads only for keys with band ``batch``, a per-owner quota that two concurrent
uploads cannot both pass, and expiry (``expires_after``, the default, a batch's input)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from openai import OpenAI

from tests.support.settings import api_key, make_settings
from tests.support.stack import gateway

pytestmark = pytest.mark.integration

DAY_S = 86400
MAX_BYTES = 64 * 1024


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    settings = make_settings(
        redis_url,
        api_keys=[
            api_key("k-batch", "alice"),
            api_key("k-chat", "carol", bands=["interactive", "default"]),
        ],
        batch={"max_file_bytes": 48 * 1024, "owner_max_bytes": MAX_BYTES, "owner_max_files": 5},
    )
    with gateway(settings) as running:
        yield running


def client(url: str, key: str = "k-batch") -> OpenAI:
    """The key's client, closed with the test's gateway (``url``)."""
    if (url, key) not in _CLIENTS:
        _CLIENTS[url, key] = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    return _CLIENTS[url, key]


_CLIENTS: dict[tuple[str, str], OpenAI] = {}


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.popitem()[1].close()


def upload(url: str, size: int, key: str = "k-batch") -> openai.types.FileObject:
    data = io.BytesIO(b"x" * size)
    return client(url, key).files.create(file=("in.jsonl", data), purpose="batch")


def test_a_key_without_band_batch_may_not_upload(url: str) -> None:
    with pytest.raises(openai.PermissionDeniedError) as refused:
        upload(url, 100, key="k-chat")
    assert refused.value.status_code == 403
    message = str(refused.value.body["message"])  # type: ignore[index]
    assert "may not upload files" in message and "band 'batch'" in message
    assert client(url, "k-chat").files.list().data == []


def test_of_two_concurrent_uploads_for_the_last_of_a_quota_only_one_passes(url: str) -> None:
    kept = upload(url, MAX_BYTES - 30 * 1024)  # 30 KB left
    with ThreadPoolExecutor(2) as pool:
        tries = [pool.submit(upload, url, 20 * 1024) for _ in range(2)]
        outcomes = [f.exception() or f.result() for f in tries]
    stored = [o for o in outcomes if isinstance(o, openai.types.FileObject)]
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert len(stored) == 1 and len(refused) == 1, outcomes
    error = refused[0].body
    assert isinstance(error, dict) and error["code"] == "files_quota_exceeded"
    assert f"{MAX_BYTES} bytes" in str(error["message"]) and "delete" in str(error["message"])
    assert refused[0].response.headers["x-should-retry"] == "false"
    assert sorted(f.id for f in client(url).files.list()) == sorted([kept.id, stored[0].id])
    client(url).files.delete(kept.id)  # frees its share
    upload(url, 20 * 1024)


def test_an_owner_may_hold_only_so_many_files(url: str) -> None:
    for _ in range(5):
        upload(url, 10)
    with pytest.raises(openai.RateLimitError, match="limit of 5 files"):
        upload(url, 10)


def test_a_file_expires_after_what_it_asked_or_the_default(url: str) -> None:
    files = client(url).files
    asked = files.create(
        file=("a.jsonl", io.BytesIO(b"{}")),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert asked.expires_at == asked.created_at + 3600
    default = upload(url, 10)
    assert default.expires_at == default.created_at + 30 * DAY_S
    assert files.retrieve(default.id).expires_at == default.expires_at
    with pytest.raises(openai.BadRequestError, match="expires_after"):
        files.create(
            file=("a.jsonl", io.BytesIO(b"{}")),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 60},
        )


def test_a_batch_keeps_its_input_file_past_its_own_window(url: str) -> None:
    openai_client = client(url)
    soon = openai_client.files.create(
        file=("a.jsonl", io.BytesIO(b"{}\n")),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    batch = openai_client.batches.create(
        input_file_id=soon.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    kept = openai_client.files.retrieve(soon.id).expires_at
    assert batch.expires_at is not None and kept is not None
    assert kept >= batch.expires_at + 3 * DAY_S - 5  # the window, then batch.line_keep_s
    assert kept <= int(time.time()) + DAY_S + 3 * DAY_S
