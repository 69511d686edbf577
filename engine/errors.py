"""Typed errors the engine raises; callers map them to their own surface (CLI message, HTTP 400)."""
from __future__ import annotations

# A bad request is the one error type shared with the layers above (protocol/errors.py).
from raypd.protocol.errors import InvalidRequestError

__all__ = ["ConfigError", "EngineError", "InvalidRequestError", "ModelLoadError", "UnsupportedModelError"]


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class ModelLoadError(EngineError):
    """The model path does not exist or cannot be read."""


class UnsupportedModelError(ModelLoadError):
    """The model exists but its architecture is not one this engine implements."""


class ConfigError(EngineError, ValueError):
    """An engine option is out of range or inconsistent."""
