"""The error tree. Each error carries the API error code and HTTP status it maps to;
servers raise these, clients raise the same classes from the same codes."""

from __future__ import annotations

import msgspec


class CheramiError(Exception):
    """Root of every error this package raises."""

    code = "internal"
    status = 500

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code)
        self.message = message or self.code

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidName(CheramiError):
    code, status = "invalid_name", 400


class InvalidRequest(CheramiError):
    code, status = "invalid_request", 400


class Unauthorized(CheramiError):
    code, status = "unauthorized", 401


class Forbidden(CheramiError):
    code, status = "forbidden", 403


class NotFound(CheramiError):
    code, status = "not_found", 404


class QueueNotFound(NotFound):
    code = "queue_not_found"


class GroupNotFound(NotFound):
    code = "group_not_found"


class AlreadyExists(CheramiError):
    code, status = "already_exists", 409


class MessageTooLarge(CheramiError):
    code, status = "message_too_large", 413


class Throttled(CheramiError):
    code, status = "throttled", 429


class Unavailable(CheramiError):
    code, status = "unavailable", 503


class ExtentSealed(Unavailable):
    """An append reached an extent that no longer accepts writes; retry on another."""

    code = "extent_sealed"


class Moved(Unavailable):
    """This host no longer serves the queue: reconnect (a frontend routes anew)."""

    code = "moved"


class Fenced(Unavailable):
    """A write carried a lease epoch that is no longer current: another host took the
    lease, so this one must stop acting for it. Clients see 503 ``unavailable``."""


class ProtocolError(CheramiError):
    code, status = "protocol_error", 400


ERRORS_BY_CODE: dict[str, type[CheramiError]] = {
    cls.code: cls
    for cls in (
        CheramiError,
        InvalidName,
        InvalidRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        QueueNotFound,
        GroupNotFound,
        AlreadyExists,
        MessageTooLarge,
        Throttled,
        Unavailable,
        ExtentSealed,
        Moved,
        ProtocolError,
    )
}


def error_from_code(code: str, message: str) -> CheramiError:
    """The error class for an API code; unknown codes become the root class."""
    return ERRORS_BY_CODE.get(code, CheramiError)(message)


def error_from_response(status: int, raw: bytes) -> CheramiError:
    """The error an HTTP error reply carries (``{"error": {"code", "message"}}``), or
    a plain one naming the status when the body is not that."""
    try:
        err = msgspec.json.decode(raw)["error"]
        return error_from_code(err["code"], err["message"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return CheramiError(f"HTTP {status}: {raw[:200]!r}")
