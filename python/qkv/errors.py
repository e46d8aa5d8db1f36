"""The exceptions qkv raises. Every one derives from :class:`QkvError` and carries qkv's own
message, which names the field, file or token at fault.

>>> import qkv
>>> issubclass(qkv.InvalidRequestError, ValueError)
True
>>> issubclass(qkv.OverloadedError, qkv.QkvError)
True
"""

from __future__ import annotations


class QkvError(Exception):
    """The base of every error qkv raises."""

    #: Whether the same request may succeed if sent again later (a full queue, a replica
    #: that went away): clients and the Ray Serve deployment retry these.
    retryable: bool = False


class InvalidRequestError(QkvError, ValueError):
    """Bad input: a field out of range, a malformed message, a schema that does not compile.
    The message names the field at fault (``temperature: ...``)."""


class ContextLengthError(InvalidRequestError):
    """The prompt (plus at least one generated token) does not fit the context."""


class ModelLoadError(QkvError, ValueError):
    """The model could not be loaded or fetched (a missing file, a format qkv does not run)."""


class OverloadedError(QkvError, RuntimeError):
    """The engine's queue is full, or no memory for one more sequence: retry later."""

    retryable = True


class EngineClosedError(QkvError, RuntimeError):
    """The engine was closed (or its thread ended) before the request finished."""


__all__ = [
    "QkvError",
    "InvalidRequestError",
    "ContextLengthError",
    "ModelLoadError",
    "OverloadedError",
    "EngineClosedError",
]
