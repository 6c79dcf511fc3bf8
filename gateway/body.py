"""Reading a request body without ever holding more than the configured limit, and a
header a request may send only once."""

from __future__ import annotations

from fastapi import Request

from broker.errors import BodyTooLarge, InvalidRequest


def single_header(request: Request, name: str, why: str, code: str) -> str | None:
    """The value of header ``name``, or None without it; sent more than once, an
    InvalidRequest (400, ``code``) that says ``why`` one is all a request has."""
    value = request.headers.get(name)
    if value is not None and len(request.headers.getlist(name)) > 1:
        raise InvalidRequest(f"send one {name} header, not several: {why}", code=code)
    return value


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body is larger than the limit of {limit} bytes")


def _declared_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidRequest("Content-Length is not a number") from None


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or BodyTooLarge as soon as either its declared or its read size exceeds
    ``limit`` (a chunked upload declares nothing, so the count while reading is the guard).
    """
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        raise _too_large(limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(limit)
    return bytes(body)
