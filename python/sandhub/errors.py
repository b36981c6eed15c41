"""Sandhub's exceptions: one class per wire code word.

Every failure the hub or a sandboxd reports arrives as ``{"code", "message"}``;
:func:`_from_native` picks the class for the code word, so callers can write
``except sandhub.NotFoundError``. Transport failures (hub down, connection
refused) are :class:`UnavailableError` with the URL in the message.
"""

from __future__ import annotations

__all__ = [
    "SandhubError",
    "InvalidArgumentError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "NotFoundError",
    "AlreadyExistsError",
    "ConflictError",
    "FailedPreconditionError",
    "ResourceExhaustedError",
    "PayloadTooLargeError",
    "UnavailableError",
    "UnimplementedError",
    "DeadlineExceededError",
    "InternalError",
    "ResponseTooLargeError",
    "SandboxLostError",
]


class SandhubError(Exception):
    """A failed Sandhub call: ``code`` is the wire word (``NOT_FOUND``...),
    ``message`` the server's explanation, ``status`` the HTTP status."""

    code: str = "UNKNOWN"
    status: int = 500

    def __init__(self, message: str, code: str | None = None, status: int | None = None) -> None:
        super().__init__(f"{code or self.code}: {message}")
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def __reduce__(self) -> tuple[type[SandhubError], tuple[str, str, int]]:
        return (type(self), (self.message, self.code, self.status))


class InvalidArgumentError(SandhubError, ValueError):
    """The request was malformed or refused by validation (``INVALID_ARGUMENT``)."""

    code, status = "INVALID_ARGUMENT", 400


class UnauthenticatedError(SandhubError):
    """No API key, or one the hub does not know (``UNAUTHENTICATED``)."""

    code, status = "UNAUTHENTICATED", 401


class PermissionDeniedError(SandhubError, PermissionError):
    """The key may not do this (``PERMISSION_DENIED``)."""

    code, status = "PERMISSION_DENIED", 403


class NotFoundError(SandhubError, LookupError):
    """No such sandbox, file, template, pool or environment (``NOT_FOUND``)."""

    code, status = "NOT_FOUND", 404


class ConflictError(SandhubError):
    """The target's state refuses the call (``CONFLICT``)."""

    code, status = "CONFLICT", 409


class AlreadyExistsError(ConflictError):
    """Something by that name already exists: Sandhub's ``CONFLICT`` word."""


class FailedPreconditionError(SandhubError):
    """The call needs a state the target is not in (``FAILED_PRECONDITION``)."""

    code, status = "FAILED_PRECONDITION", 412


class ResourceExhaustedError(SandhubError):
    """A quota or limit was reached (``RESOURCE_EXHAUSTED``)."""

    code, status = "RESOURCE_EXHAUSTED", 429


class PayloadTooLargeError(SandhubError):
    """The request body was larger than the server takes (``PAYLOAD_TOO_LARGE``)."""

    code, status = "PAYLOAD_TOO_LARGE", 413


class UnavailableError(SandhubError, ConnectionError):
    """The hub or sandboxd is out of reach or draining (``UNAVAILABLE``)."""

    code, status = "UNAVAILABLE", 503


class UnimplementedError(SandhubError, NotImplementedError):
    """This backend or connection does not offer the call (``UNIMPLEMENTED``)."""

    code, status = "UNIMPLEMENTED", 501


class DeadlineExceededError(SandhubError, TimeoutError):
    """The call ran out of time (``DEADLINE_EXCEEDED``)."""

    code, status = "DEADLINE_EXCEEDED", 504


class InternalError(SandhubError):
    """The server failed (``INTERNAL``)."""

    code, status = "INTERNAL", 500


class ResponseTooLargeError(ResourceExhaustedError):
    """A read passed ``max_download_size``; the rest was never downloaded."""


class SandboxLostError(NotFoundError):
    """The sandbox vanished while a call on it was running."""


_BY_CODE: dict[str, type[SandhubError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        UnauthenticatedError,
        PermissionDeniedError,
        NotFoundError,
        ConflictError,
        FailedPreconditionError,
        ResourceExhaustedError,
        PayloadTooLargeError,
        UnavailableError,
        UnimplementedError,
        DeadlineExceededError,
        InternalError,
    )
}


def error_for(code: str, message: str, status: int | None = None) -> SandhubError:
    """The exception for a wire ``{code, message}`` (unknown words: ``SandhubError``)."""
    cls = _BY_CODE.get(code, SandhubError)
    return cls(message, code, status)


def _from_native(kind: str, code: str, message: str, status: int) -> SandhubError:
    """Called by the native module for every failure it raises."""
    if kind == "too_large":
        return ResponseTooLargeError(message, code, status)
    if kind == "lost":
        return SandboxLostError(message, code, status)
    return error_for(code, message, status)
