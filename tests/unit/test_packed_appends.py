"""Packed appends: how a store host reads their record count, and the frames and journal
rounds written in parts that must equal their one-piece encoding."""

from __future__ import annotations

import msgspec
import pytest

from cherami.storage.rocks import _round_parts
from cherami.wire.store import PackedAppend, encode, pack_records, packed_append, packed_count


@pytest.mark.parametrize("n", [0, 1, 15, 16, 65_535, 65_536])  # fixarray, array16, array32
def test_the_count_comes_from_the_array_header(n: int) -> None:
    records = [b"x" * (i % 300) for i in range(n)]  # bin8 and bin16 framing
    packed = bytes(pack_records(records))
    assert packed_count(packed, sum(map(len, records))) == n


@pytest.mark.parametrize(
    "packed, size",
    [
        (b"", 0),  # nothing
        (b"\xc4\x01a", 1),  # a bin, not an array
        (b"\xdc\x00", 0),  # a cut array16 header
        (bytes(pack_records([b"x" * 10] * 20)), 100),  # more bytes than 20 of 100 can fill
        (bytes(pack_records([b"abc", b"de"])), 50),  # fewer than 50 bytes of records
    ],
)
def test_what_cannot_be_a_records_array_is_refused(packed: bytes, size: int) -> None:
    with pytest.raises(ValueError):
        packed_count(packed, size)


@pytest.mark.parametrize(
    "delivery_ms, size", [(None, 70_305), ([1, 2, 3], -1), (None, -1), ([2**40] * 3, 70_305)]
)
def test_an_append_frame_in_parts_is_the_struct_encoded(
    delivery_ms: list[int] | None, size: int
) -> None:
    records = pack_records([b"a" * 300, b"b" * 5, b"c" * 70_000])
    for rid, extent, first in ((1, "e", 1), (2**33, "x" * 300, 2**50)):
        whole = encode(PackedAppend(rid, extent, first, records, delivery_ms, size))
        parts = packed_append(rid, extent, first, records, delivery_ms, size)
        assert b"".join(bytes(p) for p in parts) == whole
        assert parts[1] is records  # shared, not copied


@pytest.mark.parametrize("ops", [1, 15, 16, 70_000])  # array headers of every size
def test_a_journal_round_in_parts_is_the_round_encoded(ops: int) -> None:
    journaled = [
        (
            f"e{i}",
            i * 3,
            pack_records([b"x" * (i % 300), b"y"]) if i % 2 else [b"z" * (i % 300)],
            None if i % 3 else [1, 2],
        )
        for i in range(ops)
    ]
    parts = _round_parts(journaled)  # type: ignore[arg-type]
    assert b"".join(bytes(p) for p in parts) == msgspec.msgpack.encode(journaled)
    if ops == 1:
        assert len(parts) == 2  # the array header and one op (i == 0: not packed)
    else:
        assert parts[3] is journaled[1][2]  # the packed records, not copied
