"""The pure parts of quotas (``broker.quotas``): the windows' arithmetic, what a request's
reading says of each unit and of a refusal, the estimate, and the settings that name
quotas (each problem at the setting to change, as ``fairq config check`` shows it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from broker import Settings, keys, lua
from broker.jobs import RequestKind
from broker.quotas import (
    DAY_MS,
    MINUTE_MS,
    Counts,
    Quota,
    QuotaBook,
    Reading,
    Unit,
    Window,
    reading,
    refusal_message,
)
from broker.requests import estimate_tokens
from broker.settings import QuotaConfig
from tests.support.cli import fairq
from tests.support.settings import api_key, make_settings

# 2025-06-01 00:00:00 UTC, a whole day and minute, plus 12 h 30 min 15.5 s.
NOON = 1748736000000 + (12 * 3600 + 30 * 60) * 1000 + 15_500


def quota(**limits: int) -> Quota:
    return Quota(keys.tenant_quota("lab"), QuotaConfig(tenant="lab", **limits))


def test_a_window_resets_at_its_next_boundary_in_utc() -> None:
    assert Window.MINUTE.reset_ms(NOON) == 44_500
    assert Window.DAY.reset_ms(NOON) == DAY_MS - (12 * 3600 + 30 * 60) * 1000 - 15_500
    assert Window.MINUTE.reset_ms(NOON - 15_500) == MINUTE_MS  # at a boundary: a whole one
    assert NOON // DAY_MS * DAY_MS == 1748736000000  # day numbers are UTC days


def test_the_scripts_windows_are_these() -> None:
    prelude = (Path(lua.__file__).parent / "prelude.lua").read_text()
    assert f"local MINUTE_MS, DAY_MS = {MINUTE_MS}, {DAY_MS}\n" in prelude


def test_each_unit_stands_at_its_tightest_limit() -> None:
    q = quota(tokens_per_minute=1000, tokens_per_day=5000, requests_per_day=10)
    now = Reading(NOON, ((q, Counts(200, 4600, 1, 3)),), tokens=50)
    tokens = now.standing(Unit.TOKENS)
    assert tokens is not None and tokens.limit == 5000 and tokens.remaining == 400
    assert tokens.reset_ms == Window.DAY.reset_ms(NOON)  # the day's leaves less than the minute's
    requests = now.standing(Unit.REQUESTS)
    assert requests is not None and requests == (10, 7, Window.DAY.reset_ms(NOON))
    # Used past a limit (usage above the estimate): nothing remains, never less.
    over = Reading(NOON, ((quota(tokens_per_minute=100), Counts(130, 130, 1, 1)),), 1)
    assert over.standing(Unit.TOKENS) == (100, 0, 44_500) and over.standing(Unit.REQUESTS) is None


def test_of_two_limits_with_as_much_left_the_one_that_frees_later_stands() -> None:
    q = quota(tokens_per_minute=100, tokens_per_day=100)
    standing = Reading(NOON, ((q, Counts(40, 40, 1, 1)),), 1).standing(Unit.TOKENS)
    assert standing is not None and standing.reset_ms == Window.DAY.reset_ms(NOON)


def test_a_refusal_names_the_limit_passed_that_frees_last() -> None:
    q = quota(tokens_per_minute=100, tokens_per_day=1000, requests_per_minute=3)
    fits = Reading(NOON, ((q, Counts(50, 900, 2, 2)),), tokens=50)
    assert fits.refusal() is None  # 100 of 100: a limit is a bound, not a wall before it
    minute = Reading(NOON, ((q, Counts(60, 900, 2, 2)),), tokens=50).refusal()
    assert minute is not None and (minute.window, minute.unit) == (Window.MINUTE, Unit.TOKENS)
    assert minute.retry_after_ms == 44_500 and not minute.never
    both = Reading(NOON, ((q, Counts(60, 990, 3, 3)),), tokens=50).refusal()
    assert both is not None and both.window is Window.DAY  # the minute's reset is no use
    assert refusal_message(both) == (
        "Rate limit reached for tenant 'lab' on tokens per day: Limit 1000, Used 990, "
        f"Requested 50. Please try again in {-(-Window.DAY.reset_ms(NOON) // 1000)}s."
    )
    alone = Reading(NOON, ((q, Counts(0, 0, 0, 0)),), tokens=101).refusal()
    assert alone is not None and alone.never
    assert refusal_message(alone).startswith("Request too large for tenant 'lab'")


def test_the_scripts_reply_reads_as_each_quotas_counts() -> None:
    a, b = (
        quota(tokens_per_minute=9),
        Quota(keys.user_quota("u"), QuotaConfig(user="u", requests_per_day=1)),
    )
    read = reading([NOON, 1, 2, 3, 4, 5, 6, 7, 8], [a, b], tokens=1)
    assert read.now_ms == NOON and read.quotas == ((a, Counts(1, 2, 3, 4)), (b, Counts(5, 6, 7, 8)))


def test_the_book_gives_a_jobs_tenants_quota_then_its_users() -> None:
    book = QuotaBook(
        [QuotaConfig(user="alice", tokens_per_day=1), QuotaConfig(tenant="lab", tokens_per_day=2)]
    )
    assert [q.key for q in book.of("lab", "alice")] == [
        keys.tenant_quota("lab"), keys.user_quota("alice")
    ]  # fmt: skip
    assert book.of("other", "bob") == () and QuotaBook([]).of("lab", "alice") == ()


def test_the_estimate_is_the_prompt_at_four_characters_a_token_and_the_output_asked() -> None:
    model = make_settings(model_fields={"default_output_tokens": 64}).models[0]
    messages = [{"role": "user", "content": "x" * 400}]
    prompt = len('[{"role":"user","content":""}]') // 4 + 100
    assert estimate_tokens({"messages": messages, "max_tokens": 10}, model) == prompt + 10
    assert estimate_tokens({"messages": messages, "max_completion_tokens": 7}, model) == prompt + 7
    assert estimate_tokens({"prompt": "hi"}, model) == 1 + 64


def test_an_embedding_is_estimated_without_output_and_a_response_by_max_output_tokens() -> None:
    model = make_settings(model_fields={"default_output_tokens": 64}).models[0]
    text = "x" * 398  # 400 characters as JSON
    assert estimate_tokens({"input": text}, model, RequestKind.EMBEDDING) == 100
    response = {"input": text, "max_output_tokens": 9}
    assert estimate_tokens(response, model, RequestKind.RESPONSE) == len(f'["","{text}"]') // 4 + 9
    assert estimate_tokens({"input": text}, model, RequestKind.RESPONSE) == 101 + 64


def settings_error(**config: Any) -> str:
    with pytest.raises(ValidationError) as refused:
        make_settings(**config)
    return str(refused.value)


def test_a_quota_names_a_tenant_or_a_user_and_a_limit() -> None:
    assert "name either a tenant or a user" in settings_error(quotas=[{"tokens_per_day": 1}])
    both = [{"tenant": "alice", "user": "alice", "tokens_per_day": 1}]
    assert "name either a tenant or a user" in settings_error(quotas=both)
    assert "at least one of tokens_per_minute" in settings_error(quotas=[{"tenant": "alice"}])


def test_a_quota_must_count_someone_once() -> None:
    typo = settings_error(quotas=[{"tenant": "alcie", "tokens_per_day": 1}])
    assert "no API key has tenant 'alcie'" in typo
    twice = [{"user": "bob", "tokens_per_day": 1}, {"user": "bob", "requests_per_day": 1}]
    assert "quotas[0] is the user 'bob''s too" in settings_error(quotas=twice)
    keyed = [api_key("k", "alice", tenant="lab")]
    assert make_settings(api_keys=keyed, quotas=[{"tenant": "lab", "tokens_per_day": 1}])
    assert make_settings(quotas=[{"tenant": "bob", "tokens_per_day": 1}])  # bob's own tenant


def test_config_check_refuses_quotas_on_a_redis_cluster_at_their_line(tmp_path: Path) -> None:
    text = (
        "redis_cluster: true\n"
        "api_keys:\n"
        f"  - {{sha256: {'a' * 64}, user: alice}}\n"
        "quotas:\n"
        "  - tenant: alice\n"
        "    tokens_per_day: 1000\n"
    )
    path = tmp_path / "fairq.yaml"
    path.write_text(text)
    done = fairq("config", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{path}:5: quotas[0]: quotas need a single Redis: a tenant's counters are shared by "
        "all its models, and on a Redis Cluster each model's keys live in a slot of their "
        "own; remove the quotas, or run this deployment on a single Redis"
    ]
    assert Settings.model_fields["quotas"].default == ()
