"""The error tree. Each error carries the API error code and HTTP status it maps to;
servers raise these, clients raise the same classes from the same codes. Every error
the product raises derives from ``CheramiError`` (the storage layer's ``StorageError``
and the store client's ``StoreError`` too), and every code is listed in docs/api.md's
error table (tests/unit/test_docs_consistency.py checks both ways)."""

from __future__ import annotations

import math
from typing import Any

import msgspec


class CheramiError(Exception):
    """Root of every error this package raises."""

    code = "internal"
    status = 500

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code)
        self.message = message or self.code

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {"error": {"code": self.code, "message": self.message}}


class InvalidName(CheramiError):
    code, status = "invalid_name", 400


class InvalidRequest(CheramiError):
    code, status = "invalid_request", 400


class ConfigError(InvalidRequest):
    """A setting a process was started with is wrong: a command-line flag, a ``CHERAMI_*``
    variable or the config file, or a client's URL whose host name does not resolve.
    Never answered over HTTP: the CLI prints it as one line and exits 2, as for its other
    usage errors. An ``InvalidRequest`` still, for callers that catch that."""

    code = "invalid_config"


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


class MessageNotFound(NotFound):
    """A cancel named no delayed message pending in the queue."""

    code = "message_not_found"


class AlreadyExists(CheramiError):
    code, status = "already_exists", 409


class AlreadyDue(CheramiError):
    """A cancel came when the delayed message was due (or within 5 s of it)."""

    code, status = "already_due", 409


class MessageTooLarge(CheramiError):
    code, status = "message_too_large", 413


class Throttled(CheramiError):
    """A publish over a rate limit (the queue's or the API key's). Nothing of the batch
    was stored: send it again after ``retry_after`` seconds (the reply's ``Retry-After``
    header, rounded up, and ``retry_after_ms`` in its body)."""

    code, status = "throttled", 429

    def __init__(self, message: str = "", retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = max(0.0, retry_after)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        body = super().to_dict()
        body["error"]["retry_after_ms"] = self.retry_after_ms
        return body

    @property
    def retry_after_ms(self) -> int:
        return math.ceil(self.retry_after * 1000)

    @property
    def retry_after_header(self) -> str:
        """``Retry-After``: whole seconds, rounded up, at least 1."""
        return str(max(1, math.ceil(self.retry_after)))


class TooManyStreams(Throttled):
    """A new stream over the server's ``max_streams`` or the API key's
    ``max_streams_per_key`` (429 at the upgrade, with Retry-After): open it again
    later, or close one."""

    code = "too_many_streams"


class BacklogFull(Throttled):
    """A publish to a queue whose unconsumed bytes are over its ``max_backlog_bytes``."""

    code = "backlog_full"


class StorageFull(Throttled):
    """A publish whose extents' store hosts are below their free-disk floor: nothing was
    stored; it goes through again once space is freed (or other store hosts take over)."""

    code = "storage_full"


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


class GrantExpired(Forbidden):
    """A store host refused a read: the read grant it was made under has expired (a
    store-protocol answer, never an HTTP one). Ask the frontend for a new grant."""

    code = "grant_expired"


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
        MessageNotFound,
        AlreadyExists,
        AlreadyDue,
        MessageTooLarge,
        Throttled,
        TooManyStreams,
        BacklogFull,
        StorageFull,
        Unavailable,
        ExtentSealed,
        Moved,
        ProtocolError,
        GrantExpired,
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
        error = error_from_code(err["code"], err["message"])
        if isinstance(error, Throttled) and "retry_after_ms" in err:
            error.retry_after = max(0.0, float(err["retry_after_ms"]) / 1000)
    except (msgspec.DecodeError, KeyError, TypeError, ValueError):
        what = (
            f"HTTP {status} without a Cherami error body: the URL may not point at a "
            f"Cherami server, or a proxy answered ({raw[:120]!r})"
        )
        if status in (502, 503, 504):  # a proxy or balancer in front: worth a retry
            return Unavailable(what)
        return CheramiError(what)
    return error
