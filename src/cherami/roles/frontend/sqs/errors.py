"""SQS's errors: each with the name the JSON protocol gives it (``__type``), the code the
query protocol gives it (and the JSON protocol's ``x-amzn-query-error`` header), its
HTTP status and who is at fault, so an SDK's retry and exception logic works as with
SQS. ``from_cherami`` maps the frontend's own errors onto them."""

from __future__ import annotations

from cherami.errors import (
    AlreadyExists,
    CheramiError,
    Forbidden,
    InvalidName,
    InvalidRequest,
    MessageTooLarge,
    NotFound,
    Throttled,
    Unauthorized,
    Unavailable,
)

JSON_PREFIX = "com.amazonaws.sqs#"


class SqsError(Exception):
    """An SQS error answer: ``name`` (the JSON ``__type``), ``code`` (query), status."""

    def __init__(
        self, name: str, message: str, status: int = 400, code: str | None = None,
        sender: bool = True,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.name = name
        self.code = code or name
        self.message = message
        self.status = status
        self.sender = sender

    @property
    def fault(self) -> str:
        return "Sender" if self.sender else "Receiver"


def _sqs(name: str) -> str:
    return "AWS.SimpleQueueService." + name


def no_queue(name: str) -> SqsError:
    return SqsError(
        "QueueDoesNotExist", f"The specified queue {name} does not exist.",
        code=_sqs("NonExistentQueue"),
    )  # fmt: skip


def queue_exists(name: str) -> SqsError:
    return SqsError(
        "QueueNameExists",
        f"A queue named {name} already exists with different attributes.",
        code="QueueAlreadyExists",
    )


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def missing(parameter: str) -> SqsError:
    return SqsError("MissingParameter", f"The request must contain the parameter {parameter}.")


def bad_attribute_name(name: str) -> SqsError:
    return SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")


def bad_attribute_value(name: str, why: str) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}. {why}")


def bad_receipt(receipt: str) -> SqsError:
    return SqsError("ReceiptHandleIsInvalid", f"The input receipt handle {receipt!r} is invalid.")


def not_inflight() -> SqsError:
    return SqsError(
        "MessageNotInflight", "The message referred to is not in flight.",
        code=_sqs("MessageNotInflight"),
    )  # fmt: skip


def unsupported(what: str) -> SqsError:
    return SqsError("UnsupportedOperation", what, code=_sqs("UnsupportedOperation"))


def batch(name: str, message: str) -> SqsError:
    """EmptyBatchRequest, TooManyEntriesInBatchRequest, BatchEntryIdsNotDistinct,
    InvalidBatchEntryId, BatchRequestTooLong."""
    return SqsError(name, message, code=_sqs(name))


def unknown_action(action: str) -> SqsError:
    return SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")


def not_found(message: str) -> SqsError:
    return SqsError("ResourceNotFoundException", message, status=404)


def access_denied(message: str) -> SqsError:
    return SqsError("AccessDenied", message, status=403)


def signature(name: str, message: str) -> SqsError:
    """SignatureDoesNotMatch, InvalidClientTokenId, MissingAuthenticationToken,
    IncompleteSignature, RequestExpired."""
    status = 400 if name in ("IncompleteSignature", "RequestExpired") else 403
    return SqsError(name, message, status=status)


def from_cherami(err: CheramiError, queue: str = "") -> SqsError:
    """The SQS error for an error of the frontend's own calls."""
    if isinstance(err, InvalidName):
        return invalid(f"Can only include alphanumeric characters, hyphens, or underscores. {err}")
    if isinstance(err, MessageTooLarge):
        return invalid(f"One or more parameters are invalid. Reason: {err.message}")
    if isinstance(err, InvalidRequest):
        return invalid(err.message)
    if isinstance(err, NotFound):
        return no_queue(queue) if queue else not_found(err.message)
    if isinstance(err, AlreadyExists):
        return queue_exists(queue)
    if isinstance(err, Unauthorized):
        return signature("InvalidClientTokenId", err.message)
    if isinstance(err, Forbidden):
        return access_denied(err.message)
    if isinstance(err, Throttled):  # the SDKs back off and retry RequestThrottled
        return SqsError("RequestThrottled", err.message, code="RequestThrottled")
    if isinstance(err, Unavailable):  # a 503 the SDKs retry
        return SqsError("ServiceUnavailable", err.message, status=503, sender=False)
    return internal(err.message)


def internal(message: str = "We encountered an internal error. Please try again.") -> SqsError:
    return SqsError("InternalFailure", message, status=500, sender=False)
