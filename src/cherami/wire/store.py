"""Frames of the internal store-host protocol (input host and output host to store host).

Every request carries a request id ``rid``; the store host answers each request with
exactly one reply carrying the same ``rid``. Appends on one connection are applied and
acknowledged in the order they were sent, so an ``Appended`` reply also confirms every
earlier append on that connection. Frames travel length-prefixed (see ``framing``).
"""

from __future__ import annotations

import msgspec

PLAIN = "plain"
TIMER = "timer"


class CreateExtent(msgspec.Struct, array_like=True, tag=1, frozen=True):
    rid: int
    extent: str
    kind: str  # PLAIN or TIMER


class Append(msgspec.Struct, array_like=True, tag=2, frozen=True, gc=False):
    """Append ``records`` (a msgpack array of bin) at sequence numbers ``first_seq``
    onwards.

    ``delivery_ms`` is given for timer extents only (one per record), so the store
    keys each record by delivery time first. ``size`` is the records' total length
    (without framing), -1 when not given: with it, a store keeps a plain extent's array
    as it came (``packed_count``) instead of decoding it record by record.
    """

    rid: int
    extent: str
    first_seq: int
    records: msgspec.Raw
    delivery_ms: list[int] | None = None
    size: int = -1


class PackedAppend(msgspec.Struct, array_like=True, tag=2, frozen=True, gc=False):
    """An ``Append`` as the input host sends it: the records array encoded once
    (``pack_records``) and shared by the frames to every replica."""

    rid: int
    extent: str
    first_seq: int
    records: msgspec.Raw
    delivery_ms: list[int] | None = None
    size: int = -1


class Read(msgspec.Struct, array_like=True, tag=3, frozen=True):
    """Read records after storage key ``after`` (empty: from the start).

    ``until_ms`` bounds timer extents: only records due at or before it. ``wait_ms``
    makes the read wait for new appends when there is nothing to return yet. ``joined``
    asks for the records as one msgpack array of the records themselves
    (``ReadResult.joined``) instead of a list of byte strings: a reader decodes them in
    one call.
    """

    rid: int
    extent: str
    after: bytes
    max_count: int
    until_ms: int = 0
    wait_ms: int = 0
    max_bytes: int = 1 << 20
    joined: bool = False


class Seal(msgspec.Struct, array_like=True, tag=4, frozen=True):
    """Seal the extent; ``at_seq`` < 0 seals at the last sequence number it holds."""

    rid: int
    extent: str
    at_seq: int = -1


class Info(msgspec.Struct, array_like=True, tag=5, frozen=True):
    rid: int
    extents: list[str]


class Drop(msgspec.Struct, array_like=True, tag=6, frozen=True):
    rid: int
    extent: str


class Commit(msgspec.Struct, array_like=True, tag=7, frozen=True):
    """Every replica holds the extent up to ``seq``: readers may see it. The only
    request without a reply (``rid`` is not used)."""

    rid: int
    extent: str
    seq: int


class Appended(msgspec.Struct, array_like=True, tag=10, frozen=True):
    rid: int
    last_seq: int


class ReadResult(msgspec.Struct, array_like=True, tag=11, frozen=True, gc=False):
    """``end`` is true when the extent is sealed and nothing is left after the last key.

    For a ``joined`` read, ``records`` is empty and ``joined`` is a msgpack array of the
    records (each record's own encoding, as stored, one after another behind the
    array's header: ``join_records``)."""

    rid: int
    keys: list[bytes]
    records: list[bytes]
    end: bool
    joined: bytes | None = None


class ExtentInfo(msgspec.Struct, array_like=True, frozen=True):
    extent: str
    kind: str
    last_seq: int
    count: int
    bytes: int
    sealed: bool
    exists: bool = True


class InfoResult(msgspec.Struct, array_like=True, tag=12, frozen=True):
    rid: int
    extents: list[ExtentInfo]


class Done(msgspec.Struct, array_like=True, tag=13, frozen=True):
    rid: int
    last_seq: int = 0


class Failed(msgspec.Struct, array_like=True, tag=14, frozen=True):
    rid: int
    code: str
    message: str


Request = CreateExtent | Append | Read | Seal | Info | Drop | Commit
Reply = Appended | ReadResult | InfoResult | Done | Failed

_encoder = msgspec.msgpack.Encoder()
_request_decoder: msgspec.msgpack.Decoder[Request] = msgspec.msgpack.Decoder(Request)
_reply_decoder: msgspec.msgpack.Decoder[Reply] = msgspec.msgpack.Decoder(Reply)
_records_decoder = msgspec.msgpack.Decoder(list[bytes])


def encode(frame: Request | Reply | PackedAppend) -> bytes:
    return _encoder.encode(frame)


def packed_append(
    rid: int,
    extent: str,
    first_seq: int,
    records: msgspec.Raw,
    delivery_ms: list[int] | None,
    size: int,
) -> tuple[bytes, msgspec.Raw, bytes]:
    """The frame body of ``PackedAppend(rid, extent, first_seq, records, delivery_ms,
    size)`` in three parts, the records as they are: msgpack is concatenative, so the
    frame to each replica shares the records instead of copying them into its own."""
    head = _encoder.encode((2, rid, extent, first_seq))  # the tag, then the fields
    tail = _encoder.encode((delivery_ms, size))
    return array_header(7) + head[1:], records, tail[1:]  # one array of all seven


def array_header(n: int) -> bytes:
    """A msgpack array header for ``n`` items (to splice encoded parts into one array)."""
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2) if n < 1 << 16 else b"\xdd" + n.to_bytes(4)


def pack_records(records: list[bytes]) -> msgspec.Raw:
    return msgspec.Raw(_encoder.encode(records))


def unpack_records(packed: bytes | bytearray | msgspec.Raw) -> list[bytes]:
    """The records of a packed array (``pack_records``)."""
    return _records_decoder.decode(packed)


def packed_count(packed: bytes | msgspec.Raw, size: int) -> int:
    """How many records a packed array (``pack_records``) holds, read from its header;
    ValueError when the header is not an array's or ``size`` cannot be its records'
    total (each bin has 2 to 5 bytes of framing)."""
    view = memoryview(packed)
    first = view[0] if len(view) else 0
    if 0x90 <= first <= 0x9F:
        count, header = first & 0x0F, 1
    elif first == 0xDC and len(view) >= 3:
        count, header = int.from_bytes(view[1:3]), 3
    elif first == 0xDD and len(view) >= 5:
        count, header = int.from_bytes(view[1:5]), 5
    else:
        raise ValueError("the records are not a msgpack array")
    if not header + size + 2 * count <= len(view) <= header + size + 5 * count:
        raise ValueError(f"{count} records cannot total {size} bytes in {len(view)}")
    return count


def join_records(records: list[bytes]) -> bytes:
    """The records as one msgpack array of what each encodes (a joined read's answer):
    the header, then each record's bytes as they are stored."""
    return array_header(len(records)) + b"".join(records)


def decode_request(data: bytes | bytearray) -> Request:
    return _request_decoder.decode(data)


def decode_reply(data: bytes | bytearray) -> Reply:
    return _reply_decoder.decode(data)
