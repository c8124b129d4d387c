"""The stored form of one message: written once by the input host, never modified."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import msgspec


class Record(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message as it is kept in an extent replica.

    ``delivery_ms`` equals ``enqueued_ms`` for plain messages; for delayed ones it is
    the earliest time the message may be delivered; ``expires_ms``, when set, the time
    from which it is never delivered (its TTL, checked at delivery). ``orig_id`` is set on messages
    that were moved to a dead-letter queue, so they keep their id across the move.
    """

    enqueued_ms: int
    delivery_ms: int
    body: bytes
    attributes: dict[str, str] | None = None
    orig_id: str | None = None
    text: bool | None = None  # published as text (True), as base64 bytes (False), or unknown
    dedup_id: str | None = None  # the producer's deduplication id (roles/inputhost/dedup.py)
    key: str | None = None  # its ordering key (roles/outputhost/keygate.py)
    expires_ms: int | None = None  # its TTL: never delivered at or after this (epoch ms)


class Message(msgspec.Struct, frozen=True, gc=False):
    """A message to publish, as producers hand it to an input host (the public API, a
    stream, an internal publish to a DLQ)."""

    body: bytes
    attributes: dict[str, str] | None = None
    delay_ms: int | None = None  # None: the queue's default delay
    orig_id: str | None = None
    text: bool | None = None
    dedup_id: str | None = None  # a repeat within the queue's dedup window is not stored
    key: str | None = None  # ordering key: one at a time, in publish order, per group
    expires_ms: int | None = None  # never delivered at or after this time (epoch ms)


# an ordering key: 1 to 128 characters, no control characters (docs/api.md, "Ordering keys")
KEY_MAX = 128
KEY_PATTERN = "^[^\\x00-\\x1f\\x7f]+$(?!\\n)"  # ($ alone passes a final newline)
OrderingKey = Annotated[str, msgspec.Meta(min_length=1, max_length=KEY_MAX, pattern=KEY_PATTERN)]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Record)
_array_decoder = msgspec.msgpack.Decoder(list[Record])


encode_record: Callable[[Record], bytes] = _encoder.encode  # no Python call per record


def decode_record(data: bytes) -> Record:
    return _decoder.decode(data)


def decode_records(data: list[bytes]) -> list[Record]:
    """Many records in one C-level loop (no Python call per record)."""
    return list(map(_decoder.decode, data))


def decode_record_array(data: bytes) -> list[Record]:
    """A msgpack array of records (a joined read's answer, wire.store.join_records) in
    one call."""
    return _array_decoder.decode(data)


def message_id(extent_id: str, seq: int) -> str:
    """The public id of a message: its extent and its sequence number in it."""
    return f"{extent_id}:{seq}"


def message_ids(extent_id: str, first_seq: int, count: int) -> list[str]:
    """``message_id`` of ``count`` messages in a row from ``first_seq``."""
    prefix = f"{extent_id}:"
    return [prefix + str(seq) for seq in range(first_seq, first_seq + count)]


def expired(record: Record, now_ms: float) -> bool:
    """Whether the message's own TTL has passed (it is never delivered then)."""
    return record.expires_ms is not None and record.expires_ms <= now_ms
