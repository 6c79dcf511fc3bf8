"""Streaming fan-out (placeholder while written)."""

from typing import Any


def run(streams: int, seconds: float, tokens: int) -> dict[str, Any]:
    raise NotImplementedError


def render(result: dict[str, Any], cores: int) -> str:
    raise NotImplementedError
