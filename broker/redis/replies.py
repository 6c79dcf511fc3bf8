"""redis-py replies as the types fairq gets: bytes.

redis-py annotates each reply for both of its modes (``bytes | str``) and all of its
reply shapes; every fairq client is made with ``decode_responses=False``
(``redis_conn.CLIENT_OPTIONS``), so strings come back as bytes. These say so once, at
the edge: each is a ``cast``, nothing is converted or checked at run time.
"""

from __future__ import annotations

from typing import cast

from redis.typing import StreamRangeResponse, XReadGroupResponse, ZSetRangeResponse

Hash = dict[bytes, bytes]
Entry = tuple[bytes, Hash]


def hash_reply(reply: dict[bytes | str, bytes | str]) -> Hash:
    """An HGETALL reply."""
    return cast(Hash, reply)


def entries(reply: StreamRangeResponse | None) -> list[Entry]:
    """An XRANGE or XREVRANGE reply: (entry id, fields), oldest or newest first."""
    return cast(list[Entry], reply)


def members(reply: ZSetRangeResponse) -> list[bytes]:
    """A ZRANGE-family reply without scores."""
    return cast(list[bytes], reply)


def scored(reply: ZSetRangeResponse) -> list[tuple[bytes, float]]:
    """A ZRANGE-family reply ``withscores``: (member, score)."""
    return cast(list[tuple[bytes, float]], reply)


def values(reply: list[bytes | str | None]) -> list[bytes | None]:
    """An HMGET reply: None for a missing field."""
    return cast(list[bytes | None], reply)


def deliveries(reply: XReadGroupResponse) -> list[tuple[bytes, list[tuple[bytes, Hash | None]]]]:
    """An XREADGROUP reply: (stream key, its entries); an entry deleted after it was
    delivered comes back without fields."""
    return cast(list[tuple[bytes, list[tuple[bytes, Hash | None]]]], reply)
