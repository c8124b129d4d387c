"""Frames of the public streaming protocol (docs/protocol.md): msgpack arrays whose
first element names the frame. One frame carries many messages or many acks."""

from __future__ import annotations

import msgspec

from cherami.wire.records import OrderingKey


class OutMessage(msgspec.Struct, array_like=True, frozen=True, gc=False):
    body: bytes
    attributes: dict[str, str] | None = None
    delay_ms: int | None = None  # None (or left out): the queue's default delay
    dedup_id: str | None = None  # a repeat within the queue's dedup window is not stored
    key: OrderingKey | None = None  # ordering key (docs/protocol.md, "Ordering keys")
    ttl_ms: int | None = None  # expires this long after the publish (None: never)
    expires_ms: int | None = None  # or at this time (epoch ms); at most one of the two


class Publish(msgspec.Struct, array_like=True, tag="pub", frozen=True, gc=False):
    id: int
    messages: list[OutMessage]


class Published(msgspec.Struct, array_like=True, tag="puback", frozen=True, gc=False):
    id: int
    ids: list[str]


class Credit(msgspec.Struct, array_like=True, tag="credit", frozen=True):
    n: int


class Returned(msgspec.Struct, array_like=True, tag="returned", frozen=True):
    """Answer to a negative ``credit``: the credit taken back (at most what was asked;
    less when the server had used some of it for deliveries meanwhile)."""

    n: int


class Ack(msgspec.Struct, array_like=True, tag="ack", frozen=True, gc=False):
    handles: list[int]


class Nack(msgspec.Struct, array_like=True, tag="nack", frozen=True, gc=False):
    handles: list[int]
    delay_ms: int = 0


class Extend(msgspec.Struct, array_like=True, tag="extend", frozen=True, gc=False):
    handles: list[int]
    visibility_ms: int


class InMessage(msgspec.Struct, array_like=True, frozen=True, gc=False):
    handle: int
    id: str
    body: bytes
    attributes: dict[str, str] | None
    delivery_count: int
    enqueued_ms: int
    key: str | None = None  # left out when the message has none


class Deliver(msgspec.Struct, array_like=True, tag="deliver", frozen=True, gc=False):
    messages: list[InMessage]


class Settled(msgspec.Struct, array_like=True, tag="settled", frozen=True, gc=False):
    """Answer to ack/nack/extend: the handles that were stale (no longer current)."""

    kind: str
    stale: list[int]


class Error(msgspec.Struct, array_like=True, tag="error", frozen=True):
    id: int  # the publish batch it concerns (BadPublish.id too); 0: the stream as a whole
    code: str
    message: str


class Throttled(msgspec.Struct, array_like=True, tag="throttled", frozen=True):
    """Answer to a publish batch refused by a limit (code ``throttled``) or a full
    backlog (``backlog_full``): nothing of it was stored; send it again (on this stream)
    after ``retry_ms``. The stream stays open."""

    id: int
    code: str
    message: str
    retry_ms: int


ClientFrame = Publish | Credit | Ack | Nack | Extend
ServerFrame = Published | Deliver | Settled | Returned | Error | Throttled

_encoder = msgspec.msgpack.Encoder()
_client_decoder: msgspec.msgpack.Decoder[ClientFrame] = msgspec.msgpack.Decoder(ClientFrame)
_server_decoder: msgspec.msgpack.Decoder[ServerFrame] = msgspec.msgpack.Decoder(ServerFrame)


def encode(frame: ClientFrame | ServerFrame) -> bytes:
    return _encoder.encode(frame)


# a keyed message's tuple has its key at the end (an unkeyed one's leaves it out)
DeliveryTuple = (
    tuple[int, str, bytes, dict[str, str] | None, int, int]
    | tuple[int, str, bytes, dict[str, str] | None, int, int, str]
)


def encode_deliver(messages: list[DeliveryTuple]) -> bytes:
    """``encode(Deliver([InMessage(*m) for m in messages]))``, the same bytes (a Struct
    with array_like is an array on the wire), without a Struct per message: the output
    host's delivery path."""
    return _encoder.encode(("deliver", messages))


class BadPublish(msgspec.ValidationError):
    """A ``pub`` frame whose tag and batch id could be read but whose batch could not (a
    wrong-typed or missing field): answer ``Error(id, "invalid_request", message)`` so
    the batch gets its own reply. A ``msgspec.ValidationError``, so a caller that
    catches ``msgspec.DecodeError`` still catches it."""

    def __init__(self, id: int, message: str) -> None:
        super().__init__(message)
        self.id = id
        self.message = message


class _PublishHeader(msgspec.Struct, array_like=True, tag="pub", frozen=True):
    id: int  # the fields after it are left unread


_publish_header_decoder = msgspec.msgpack.Decoder(_PublishHeader)


def decode_client(data: bytes) -> ClientFrame:
    """Decode one client frame. Raises ``BadPublish`` for a ``pub`` frame whose id is
    readable but whose batch is not, and ``msgspec.DecodeError`` for any other frame
    that does not decode (answer those with ``Error(0, ...)``), a frame nested too deeply
    to decode included."""
    try:
        return _client_decoder.decode(data)
    except msgspec.ValidationError as err:
        try:
            header = _publish_header_decoder.decode(data)
        except (msgspec.DecodeError, RecursionError):
            raise err from None
        raise BadPublish(header.id, str(err)) from None
    except RecursionError:  # a value nested thousands deep (an attack, not a client)
        raise msgspec.DecodeError("a value is nested too deeply") from None


def decode_server(data: bytes) -> ServerFrame:
    return _server_decoder.decode(data)
