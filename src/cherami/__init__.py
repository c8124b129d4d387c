"""Cherami: a durable task queue with consumer groups, dead-letter queues and delayed
messages. The public API is what ``__all__`` names; everything else is private.

The client classes load on first use, so the server's processes that import
``cherami.<module>`` do not pay for the client's imports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cherami.errors import (
    AlreadyExists,
    CheramiError,
    ExtentSealed,
    Forbidden,
    GroupNotFound,
    InvalidName,
    InvalidRequest,
    MessageTooLarge,
    NotFound,
    ProtocolError,
    QueueNotFound,
    Throttled,
    TooManyStreams,
    Unauthorized,
    Unavailable,
)

if TYPE_CHECKING:
    from cherami.client import AsyncClient, Backoff, Client, OutgoingMessage, Received, Worker

_CLIENT = frozenset({"AsyncClient", "Backoff", "Client", "OutgoingMessage", "Received", "Worker"})

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "Backoff",
    "CheramiError",
    "Client",
    "ExtentSealed",
    "Forbidden",
    "GroupNotFound",
    "InvalidName",
    "InvalidRequest",
    "MessageTooLarge",
    "NotFound",
    "OutgoingMessage",
    "ProtocolError",
    "QueueNotFound",
    "Received",
    "Throttled",
    "TooManyStreams",
    "Unauthorized",
    "Unavailable",
    "Worker",
]


def __getattr__(name: str) -> Any:
    if name in _CLIENT:
        import cherami.client

        return getattr(cherami.client, name)
    raise AttributeError(f"module 'cherami' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CLIENT)
