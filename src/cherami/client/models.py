"""What the client hands to user code."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A message to publish; plain ``str`` and ``bytes`` bodies are accepted too."""

    body: bytes | str
    attributes: dict[str, str] | None = None
    delay_seconds: float | None = None  # None: the queue's default delay
    dedup_id: str | None = None  # the queue stores a repeat within its dedup window once

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = (
            {"body": self.body}
            if isinstance(self.body, str)
            else {"body_b64": base64.b64encode(self.body).decode()}
        )
        if self.attributes:
            out["attributes"] = self.attributes
        if self.delay_seconds is not None:
            out["delay_seconds"] = self.delay_seconds
        if self.dedup_id is not None:
            out["dedup_id"] = self.dedup_id
        return out


def outgoing(item: OutgoingMessage | bytes | str) -> OutgoingMessage:
    return item if isinstance(item, OutgoingMessage) else OutgoingMessage(item)


class Received(msgspec.Struct, array_like=True, kw_only=True, gc=False):
    """One delivery. ``receipt`` (HTTP) or ``handle`` (stream) settles it.

    The fields are in the order of a delivery on the consume stream (docs/protocol.md,
    ``deliver``), so stream deliveries decode straight into them with no copy; build one
    by keyword. Holds no references to other objects than its own values (``gc=False``).
    """

    handle: int | None = None
    id: str
    body: bytes
    attributes: dict[str, str] | None = None  # None on the wire; {} once made
    delivery_count: int
    enqueued_ms: int
    receipt: str | None = None

    def __post_init__(self) -> None:
        if self.attributes is None:
            self.attributes = {}

    @property
    def enqueued_at(self) -> datetime:
        """When the message was enqueued (UTC, millisecond precision)."""
        return datetime.fromtimestamp(self.enqueued_ms / 1000, UTC)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    @classmethod
    def from_json(cls, m: dict[str, Any]) -> Received:
        body = m["body"].encode() if "body" in m else base64.b64decode(m.get("body_b64", ""))
        return cls(
            id=m["id"], body=body, attributes=m.get("attributes") or {},
            delivery_count=m.get("delivery_count", 0), enqueued_ms=_ms(m.get("enqueued_at")),
            receipt=m.get("receipt"),
        )  # fmt: skip


def _ms(rfc3339: str | None) -> int:
    if not rfc3339:
        return 0
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)
