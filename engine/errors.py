"""Typed errors the engine raises; callers map them to their own surface (CLI message, HTTP 400)."""
from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """A request the engine can never serve as given. `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class ModelLoadError(EngineError):
    """The model path does not exist or cannot be read."""


class UnsupportedModelError(ModelLoadError):
    """The model exists but its architecture is not one this engine implements."""


class ConfigError(EngineError, ValueError):
    """An engine option is out of range or inconsistent."""
