"""A request's own queue deadline (broker.deadlines): the values accepted, the 400 of the
others, and the shorter of it and its band's deadline."""

from __future__ import annotations

import pytest

from broker.deadlines import MAX_QUEUE_S, max_queue_s, own_deadline_ms
from broker.errors import InvalidRequest

HEADER = "X-Fairq-Max-Queue-S"
BANDS = {"interactive": 600.0, "default": 3600.0}  # batch: no deadline


@pytest.mark.parametrize(
    ("sent", "seconds"),
    [("20", 20.0), ("2.5", 2.5), (" 1 ", 1.0), (".5", 0.5), ("7.", 7.0), ("604800", 604800.0)],
)
def test_a_number_of_seconds_in_digits_is_accepted(sent: str, seconds: float) -> None:
    assert max_queue_s(sent, HEADER) == seconds


@pytest.mark.parametrize(
    "sent",
    ["", "abc", "0", "0.0", "-5", "+5", "nan", "NaN", "inf", "Infinity", "1e3", "1_000",
     "٣", "5, 10", "5s", "604800.5", "9" * 400],
)  # fmt: skip
def test_anything_else_is_a_400_that_says_what_is_accepted(sent: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        max_queue_s(sent, HEADER)
    error = refused.value
    assert (error.status, error.code, error.param) == (400, "invalid_max_queue_s", None)
    assert error.message.startswith(f"{HEADER} must be a number of seconds above 0")
    assert f"at most {MAX_QUEUE_S}" in error.message and "such as 20 or 2.5" in error.message


def test_a_long_value_is_shown_cut_short() -> None:
    with pytest.raises(InvalidRequest) as refused:
        max_queue_s("x" * 5000, HEADER)
    assert len(refused.value.message) < 400 and "xxx..." in refused.value.message


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), 1e300])
def test_the_python_clients_number_is_held_to_the_same_bounds(value: float) -> None:
    with pytest.raises(InvalidRequest, match=r"^max_queue_s must be"):
        max_queue_s(value, "max_queue_s")
    assert max_queue_s(1.5, "max_queue_s") == 1.5


def test_a_job_has_a_deadline_of_its_own_only_when_shorter_than_its_bands() -> None:
    assert own_deadline_ms(None, "interactive", BANDS) is None
    assert own_deadline_ms(20.0, "interactive", BANDS) == 20_000
    # Clamped: the band's deadline, already enforced, is the job's.
    assert own_deadline_ms(600.0, "interactive", BANDS) is None
    assert own_deadline_ms(900.0, "interactive", BANDS) is None
    assert own_deadline_ms(900.0, "default", BANDS) == 900_000
    # A band without a deadline: any value asked is the job's.
    assert own_deadline_ms(MAX_QUEUE_S, "batch", BANDS) == MAX_QUEUE_S * 1000


def test_a_deadline_under_a_millisecond_is_one() -> None:
    assert own_deadline_ms(0.0001, "batch", BANDS) == 1
