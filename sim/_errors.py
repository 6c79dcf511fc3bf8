"""The simulator's exceptions, under one root.

SimError
├── ProfileError   a profile file is missing, not YAML, or has unknown/invalid keys
├── RequestError   a request rejected as vLLM would (status, error type, message, param)
└── EngineStopped  the engine loop is not running (not started, shut down, crashed)
"""

from __future__ import annotations


class SimError(Exception):
    """Root of every error the engine simulator raises on purpose."""


class ProfileError(SimError, ValueError):
    """A profile file is missing, is not YAML, or holds unknown or invalid keys."""


class RequestError(SimError):
    """A request the simulator rejects, as vLLM would: status, error type, message, and the
    request field at fault where vLLM names one (``param``)."""

    def __init__(
        self, status: int, error_type: str, message: str, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.param = param


class EngineStopped(SimError, RuntimeError):
    """The engine loop is not running (not started yet, shut down, or crashed)."""
