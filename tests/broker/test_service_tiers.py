"""OpenAI's ``service_tier`` as bands (``broker.tiers``, pure), on hand-made keys: the band a
tier queues in, the best allowed band for a tier the key may not use, the tier a band's
responses say, the header's precedence; the setting's check; the field kept from the
engine."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from broker import Forbidden, InvalidRequest, ModelConfig, Principal, RequestKind, Settings
from broker.requests import engine_payload, parse_body, stream_mode
from broker.settings import DEFAULT_BANDS, DEFAULT_SERVICE_TIERS
from broker.tiers import ServiceTiers, request_band

TIERS = ServiceTiers(DEFAULT_SERVICE_TIERS, DEFAULT_BANDS)
EVERY = ("interactive", "default", "batch")  # a key's bands, its default first
DEFAULT_FIRST = ("default", "interactive", "batch")
NO_TOP = ("default", "batch")
NO_BATCH = ("interactive", "default")
BATCH_ONLY = ("batch",)


def key(bands: tuple[str, ...]) -> Principal:
    return Principal("u", "u", 1.0, bands, None, admin=False, trusted_app=False)


@pytest.mark.parametrize(
    ("tier", "allowed", "band"),
    [
        (None, DEFAULT_FIRST, "default"),  # no tier: the key's default band
        ("default", DEFAULT_FIRST, "default"),
        ("auto", DEFAULT_FIRST, "default"),
        ("default", EVERY, "interactive"),  # the key's default, whichever it is
        ("priority", DEFAULT_FIRST, "interactive"),
        ("flex", DEFAULT_FIRST, "batch"),
        ("priority", NO_TOP, "default"),  # may not use the top band: its highest
        ("flex", NO_BATCH, "default"),  # may not use batch: its lowest
        ("priority", BATCH_ONLY, "batch"),
        ("flex", BATCH_ONLY, "batch"),
    ],
)
def test_a_tier_queues_in_its_band_or_the_keys_nearest(
    tier: str | None, allowed: tuple[str, ...], band: str
) -> None:
    assert TIERS.band(tier, allowed) == band


def test_two_allowed_bands_as_near_as_each_other_give_the_higher() -> None:
    tiers = ServiceTiers({"middle": "b"}, ("a", "b", "c"))
    assert tiers.band("middle", ("c", "a")) == "a"


@pytest.mark.parametrize("tier", ["fast", "Priority", "", "x" * 500])
def test_a_tier_not_in_the_mapping_is_a_400_naming_the_accepted_ones(tier: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        TIERS.band(tier, EVERY)
    error = raised.value.to_body()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "service_tier"
    assert raised.value.status == 400
    message = error["message"] or ""
    assert all(repr(name) in message for name in ("priority", "default", "auto", "flex"))
    assert len(message) < 200  # a long value is cut short


def test_a_band_says_the_first_tier_that_names_it_and_default_where_none_does() -> None:
    assert [TIERS.tier_of(band) for band in DEFAULT_BANDS] == ["priority", "default", "flex"]
    tiers = ServiceTiers({"auto": "a", "scale": "a", "priority": "a", "default": None}, ("a", "b"))
    assert tiers.tier_of("a") == "scale"  # never auto: OpenAI answers with the tier it chose
    assert tiers.tier_of("b") == "default"
    assert tiers.tier_of("gone") == "default"  # a band these settings do not know


def test_the_defaults_over_other_bands_offer_only_the_tiers_whose_bands_exist() -> None:
    tiers = ServiceTiers(DEFAULT_SERVICE_TIERS, ("urgent", "batch"))
    assert tiers.names == ("default", "auto", "flex")
    with pytest.raises(InvalidRequest, match="'default', 'auto', 'flex'"):
        tiers.band("priority", ("urgent", "batch"))


def test_an_empty_mapping_takes_no_tier_but_a_request_without_one() -> None:
    tiers = ServiceTiers({}, DEFAULT_BANDS)
    assert tiers.band(None, NO_TOP) == "default"
    with pytest.raises(InvalidRequest, match="none in this deployment"):
        tiers.band("default", NO_TOP)


def test_the_band_header_wins_over_the_tier_and_stays_strict() -> None:
    assert request_band(key(EVERY), "batch", "priority", TIERS) == "batch"
    assert request_band(key(DEFAULT_FIRST), None, "priority", TIERS) == "interactive"
    with pytest.raises(Forbidden):
        request_band(key(NO_TOP), "interactive", None, TIERS)  # not downgraded: a 403
    with pytest.raises(InvalidRequest, match="service_tier"):
        request_band(key(EVERY), "batch", "bogus", TIERS)  # the tier is checked all the same


def test_a_mapping_the_deployment_writes_must_name_its_bands() -> None:
    with pytest.raises(ValidationError, match="'priority' must name one of the bands"):
        Settings(service_tiers={"priority": "vip"})
    assert Settings(bands=("urgent", "bulk")).service_tiers == DEFAULT_SERVICE_TIERS
    written = Settings(bands=("urgent", "bulk"), service_tiers={"priority": "urgent"})
    assert written.service_tiers == {"priority": "urgent"}


MODEL = ModelConfig(name="m", endpoints=("http://engine:8000",))


def chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_the_tier_never_reaches_the_engine_and_keeps_a_whole_answer_streamed() -> None:
    body = chat(service_tier="priority")
    assert "service_tier" not in orjson.loads(engine_payload(body, "job-1", MODEL))
    assert stream_mode(body, MODEL) is stream_mode(chat(), MODEL)


def test_a_tier_that_is_not_a_string_is_refused_by_its_name() -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse_body(RequestKind.CHAT, orjson.dumps(chat(service_tier=1)))
    assert raised.value.param == "service_tier"
