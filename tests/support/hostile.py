"""Hostile JSON for the property tests: values at the edges of what the JSON parser takes.

Each strategy draws JSON *text*, not Python values, so that a value may nest deeper than
orjson serialises (254 levels; it parses 1,024) and numbers may be written as no
serialiser would write them. ``body`` puts one such value into a request that is valid
otherwise, at one of the places a route reads (or the whole body, or an unknown field).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from hypothesis import strategies as st

_MARK = "@@hostile@@"
_QUOTED_MARK = orjson.dumps(_MARK)

# Around fairq's limit (128), orjson's serialiser (254) and its parser (1,024).
DEPTHS = st.one_of(
    st.sampled_from([127, 128, 129, 253, 254, 255, 1023, 1024, 1025]), st.integers(0, 1100)
)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: orjson.dumps(f).decode()),
    st.sampled_from(
        [
            "0", "-0", "1", "-1", "0.0", "1e308", "1e309", "-1e309", "1e-400", "1E400",
            "4294967296", "9007199254740993", "9223372036854775807", "9223372036854775808",
            "18446744073709551615", "18446744073709551616", "-9223372036854775809",
            "1" + "0" * 400, "0." + "0" * 400 + "1", "123456789.123456789e-300",
        ]
    ),
)  # fmt: skip
STRINGS = st.one_of(
    st.text(max_size=40).map(lambda s: orjson.dumps(s).decode()),  # any unicode but surrogates
    st.text(st.characters(min_codepoint=0x80, codec="utf-8"), max_size=40).map(
        lambda s: orjson.dumps(s).decode()
    ),
    st.sampled_from(
        [
            r'"\ud800"', r'"\udfff"', r'"\ud83d\ude00"', r'"\u0000"', r'"a\u0000b"',
            '"\u202e\u200b\ufeff"', '"\U0001f600"', r'"\\"', '""',
        ]
    ),  # lone and paired surrogates as escapes, NUL, bidi and zero-width characters
    st.one_of(
        st.integers(0, 5000), st.sampled_from([65_536, 500_000, 1_048_000, 1_100_000])
    ).map(lambda n: '"' + "x" * n + '"'),  # short to past the 1 MB body limit
)  # fmt: skip
SCALARS = st.one_of(NUMBERS, STRINGS, st.sampled_from(["true", "false", "null"]))


def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def _object(items: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f"{orjson.dumps(k).decode()}:{v}" for k, v in items) + "}"


CONTAINERS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(_array),
        st.lists(st.tuples(st.text(max_size=8), inner), max_size=4).map(_object),
    ),
    max_leaves=8,
)


@st.composite
def nested(draw: st.DrawFn) -> str:
    """A scalar under ``depth`` levels of arrays or objects."""
    depth, leaf = draw(DEPTHS), draw(SCALARS)
    if draw(st.booleans()):
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


VALUES = st.one_of(SCALARS, CONTAINERS, nested())


@st.composite
def body(draw: st.DrawFn, template: dict[str, Any], places: Sequence[str]) -> bytes:
    """``template`` as JSON with one hostile value at one of ``places`` (a dotted path:
    ``messages.0.content``; ``+`` as its last part: an unknown field there), or as the
    whole body."""
    value = draw(VALUES).encode()
    place = draw(st.sampled_from([*places, "+", "*"]))
    if place == "*":
        return value
    document = orjson.loads(orjson.dumps(template))
    *parents, last = place.split(".")
    target = document
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if last == "+":
        target["x_hostile"] = _MARK
    else:
        target[int(last) if isinstance(target, list) else last] = _MARK
    return orjson.dumps(document).replace(_QUOTED_MARK, value)
