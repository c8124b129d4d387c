"""What the client hands to user code."""

from __future__ import annotations

from collections.abc import Mapping
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
    key: str | None = None  # ordering key: a group gets a key's messages one at a time, in order
    # its TTL, at most one of the two: never delivered after it (docs/api.md)
    expires_in_seconds: float | None = None
    expires_at: datetime | int | str | None = None  # a datetime, ms or RFC 3339 text

    def to_json(self) -> dict[str, Any]:
        """The message as a publish request lists it, for msgspec's JSON encoder (which
        writes a bytes body as the base64 ``body_b64`` wants, in C)."""
        out: dict[str, Any] = (
            {"body": str(self.body)}  # a str subclass (an enum's value) as a plain str
            if isinstance(self.body, str)
            else {"body_b64": self.body}
        )
        if self.attributes:
            out["attributes"] = self.attributes
        if self.delay_seconds is not None:
            out["delay_seconds"] = self.delay_seconds
        if self.dedup_id is not None:
            out["dedup_id"] = self.dedup_id
        if self.key is not None:
            out["key"] = self.key
        if self.expires_in_seconds is not None:
            out["expires_in_seconds"] = self.expires_in_seconds
        if self.expires_at is not None:
            out["expires_at"] = (
                self.expires_at if isinstance(self.expires_at, str) else str(self.expires_ms())
            )
        return out

    def stream_ttl(self) -> tuple[int | None, int | None] | tuple[()]:
        """A ``pub`` frame's ``ttl_ms`` and ``expires_ms``; none without a TTL (a message
        of five fields, as servers before TTLs take)."""
        if self.expires_in_seconds is None and self.expires_at is None:
            return ()
        ttl = self.expires_in_seconds
        return (None if ttl is None else max(1, int(ttl * 1000))), self.expires_ms()

    def expires_ms(self) -> int | None:
        """``expires_at`` in ms since the epoch (a naive datetime is local time)."""
        when = self.expires_at
        if when is None or isinstance(when, int):
            return when
        if isinstance(when, str):
            if when.lstrip("-").isdigit():
                return int(when)
            when = datetime.fromisoformat(when)
        return int(when.timestamp() * 1000)


_BODIES = (bytes, bytearray, memoryview, str)


def message_list(messages: Any) -> list[Any]:
    """The messages of a publish: one message (``str``, ``bytes``, an OutgoingMessage) or
    an iterable of them. A str or bytes is one message, never one per character; a dict
    or anything else that is not a message is refused with a TypeError that says so."""
    if isinstance(messages, (*_BODIES, OutgoingMessage)):
        return [messages]
    if isinstance(messages, Mapping):
        raise TypeError(
            "a dict is not a message: publish json.dumps(it), an OutgoingMessage, "
            "or a list of messages"
        )
    try:
        items = list(messages)
    except TypeError:
        raise TypeError(_not_a_message(messages)) from None
    for item in items:
        if not isinstance(item, (*_BODIES, OutgoingMessage)):
            raise TypeError(_not_a_message(item))
    return items


def _not_a_message(item: Any) -> str:
    return (
        f"a message is a str, bytes or OutgoingMessage (or a list of them), not "
        f"{type(item).__name__}"
    )


def outgoing(item: OutgoingMessage | bytes | str) -> OutgoingMessage:
    return item if isinstance(item, OutgoingMessage) else OutgoingMessage(item)


def publish_item(item: OutgoingMessage | bytes | str) -> dict[str, Any]:
    """``item`` as a publish request lists it: a plain body goes straight into its dict
    (no OutgoingMessage made on the way: 90 against 700 ns a message)."""
    kind = type(item)
    if kind is bytes:
        return {"body_b64": item}
    if kind is str:
        return {"body": item}
    return outgoing(item).to_json()


class BodyNotText(UnicodeDecodeError):
    """``Received.text`` of a body that is not UTF-8 text: read ``body``, its bytes. A
    ValueError, and the UnicodeDecodeError that ``text`` raised before it said so."""

    def __init__(self, message_id: str, err: UnicodeDecodeError) -> None:
        super().__init__(err.encoding, err.object, err.start, err.end, err.reason)
        self.message_id = message_id

    def __str__(self) -> str:
        where = f"byte 0x{self.object[self.start]:02x} at {self.start}"
        return (
            f"the body of message {self.message_id} is not UTF-8 text ({where}): "
            "read message.body, its bytes"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        cause = UnicodeDecodeError(self.encoding, self.object, self.start, self.end, self.reason)
        return (type(self), (self.message_id, cause))


class Received(msgspec.Struct, array_like=True, kw_only=True, gc=False):
    """One delivery. ``receipt`` (HTTP) or ``handle`` (stream) settles it.

    The fields are in the order of a delivery on the consume stream (docs/protocol.md,
    ``deliver``), so stream deliveries decode straight into them with no copy; build one
    by keyword. Holds no references to other objects than its own values (``gc=False``).
    """

    handle: int | None = None
    id: str
    body: bytes
    # {} when the message has none. None on the wire: the consume stream puts {} in its
    # place as it takes deliveries in (a __post_init__ is a Python call per message)
    attributes: dict[str, str] | None = msgspec.field(default_factory=dict)
    delivery_count: int
    enqueued_ms: int
    key: str | None = None  # its ordering key, when it has one
    receipt: str | None = None

    @property
    def enqueued_at(self) -> datetime:
        """When the message was enqueued (UTC, millisecond precision)."""
        return datetime.fromtimestamp(self.enqueued_ms / 1000, UTC)

    @property
    def text(self) -> str:
        """The body as text; ``BodyNotText`` (a ValueError) when it is not UTF-8."""
        try:
            return self.body.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BodyNotText(self.id, err) from None

    @classmethod
    def from_json(cls, m: dict[str, Any]) -> Received:
        return msgspec.convert(m, _Delivered).received()


class _Delivered(msgspec.Struct, gc=False):
    """One message of a receive's answer, as the server sends it (docs/api.md)."""

    id: str
    receipt: str | None = None
    delivery_count: int = 0
    enqueued_at: str = ""
    attributes: dict[str, str] | None = None
    body: str | None = None
    body_b64: bytes | None = None  # decoded from base64 with the answer
    key: str | None = None

    def received(self) -> Received:
        body = self.body.encode() if self.body is not None else self.body_b64 or b""
        return Received(id=self.id, body=body, attributes=self.attributes or {},
                        delivery_count=self.delivery_count, enqueued_ms=_ms(self.enqueued_at),
                        key=self.key, receipt=self.receipt)  # fmt: skip


class ReceiveAnswer(msgspec.Struct, gc=False):
    """The body of a receive's answer."""

    messages: list[_Delivered]

    def received(self) -> list[Received]:
        return [m.received() for m in self.messages]


_SECONDS: dict[str, int] = {}  # "YYYY-MM-DDTHH:MM:SS" -> seconds since the epoch


def _ms(rfc3339: str | None) -> int:
    """Milliseconds since the epoch of an RFC 3339 time; the server's form
    (…T12:00:00.250Z) parses with the date part looked up once per second."""
    if not rfc3339:
        return 0
    if len(rfc3339) == 24 and rfc3339[19] == "." and rfc3339[23] == "Z":
        seconds = _SECONDS.get(rfc3339[:19])
        if seconds is None:
            if len(_SECONDS) >= 4096:
                _SECONDS.clear()
            when = datetime.fromisoformat(rfc3339[:19] + "+00:00")
            seconds = _SECONDS[rfc3339[:19]] = int(when.timestamp())
        return seconds * 1000 + int(rfc3339[20:23])
    return int(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


def receipt_list(receipts: Any) -> list[str]:
    """The receipts of an HTTP ack, nack or extend: receipts (``str``) or the messages a
    receive returned (their ``receipt``), one or a list of them."""
    if isinstance(receipts, (str, Received)):
        receipts = [receipts]
    out: list[str] = []
    for item in receipts:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Received):
            if item.receipt is None:
                raise TypeError(
                    "a message delivered on a stream has no receipt: settle it through its "
                    "consumer (consumer.ack(message))"
                )
            out.append(item.receipt)
        else:
            raise TypeError(
                f"a receipt is a str or a message a receive returned, not {type(item).__name__}"
            )
    return out
