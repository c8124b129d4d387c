"""The consume path's wire shortcuts. A joined read's records (one msgpack array of the
records themselves) decode into the same chunk as the per-record form; a malformed or
short one is a protocol error. Deliveries encoded as tuples are the Deliver frame's
bytes."""

from __future__ import annotations

import msgspec
import pytest

from cherami.errors import ProtocolError
from cherami.roles.outputhost.sharedreads import decode_chunk
from cherami.wire import stream as f
from cherami.wire.keys import plain_keys
from cherami.wire.records import Record, encode_record
from cherami.wire.store import ReadResult, array_header, decode_reply, encode, join_records


def _records(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        attributes = {"k": str(i)} if i % 3 else None
        out.append(encode_record(Record(1_000 + i, 2_000 + i, b"b" * (i % 300), attributes)))
    return out


def test_a_joined_read_decodes_as_the_per_record_form() -> None:
    records = _records(70_000 // 100)
    keys = plain_keys(41, len(records))
    plain = decode_reply(encode(ReadResult(7, keys, records, False)))
    joined = decode_reply(encode(ReadResult(7, keys, [], False, join_records(records))))
    assert isinstance(plain, ReadResult) and isinstance(joined, ReadResult)
    a = decode_chunk("s", "e", plain, timer=False)
    b = decode_chunk("s", "e", joined, timer=False)
    assert (b.keys, b.records, b.ids, b.end) == (a.keys, a.records, a.ids, a.end)
    assert b.ids[0] == "e:41" and b.records[1].attributes == {"k": "1"}
    assert b.size == a.size + len(array_header(len(records)))


def test_an_empty_joined_read() -> None:
    chunk = decode_chunk("s", "e", ReadResult(1, [], [], True, join_records([])), timer=False)
    assert chunk.records == [] and chunk.end


@pytest.mark.parametrize(
    ("keys", "raw"),
    [
        (2, array_header(2) + encode_record(Record(1, 1, b"x"))),  # short of one record
        (1, array_header(1) + b"\xc1"),  # not msgpack
        (1, array_header(1) + msgspec.msgpack.encode("not a record")),
    ],
)
def test_a_malformed_joined_read_is_a_protocol_error(keys: int, raw: bytes) -> None:
    batch = ReadResult(1, plain_keys(1, keys), [], False, raw)
    with pytest.raises(ProtocolError):
        decode_chunk("s", "e", batch, timer=False)


def test_deliveries_encoded_as_tuples_are_the_deliver_frame() -> None:
    messages = [(i + 1, f"e:{i}", b"b" * i, {"k": "v"} if i % 2 else None, 1 + i % 3, 17 + i)
                for i in range(50)]  # fmt: skip
    assert f.encode_deliver(messages) == f.encode(f.Deliver([f.InMessage(*m) for m in messages]))
    assert f.encode_deliver([]) == f.encode(f.Deliver([]))
