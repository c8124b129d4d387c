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
    # an unkeyed message's tuple leaves the key out (a Struct writes its None)
    frame = f.Deliver([f.InMessage(*m) for m in messages])
    assert f.decode_server(f.encode_deliver(messages)) == frame
    assert f.encode_deliver(messages) == f.encode(("deliver", [list(m) for m in messages]))
    keyed: list[f.DeliveryTuple] = [(1, "e:1", b"b", None, 1, 17, "order-1")]
    assert f.decode_server(f.encode_deliver(keyed)) == f.Deliver([f.InMessage(*keyed[0])])
    assert f.encode_deliver([]) == f.encode(f.Deliver([]))


def test_acks_count_each_message_once_in_the_end_to_end_histogram() -> None:
    """The ack path counts messages per distinct enqueue time: every message acked is
    one observation in its bucket, and the cursor's level moves past the acked prefix."""
    import asyncio
    import itertools
    import time

    from cherami.metadata.models import AckLevel, Extent, Group, GroupConfig, Queue, QueueConfig
    from cherami.roles.outputhost.extentreader import ExtentCursor, _run
    from cherami.roles.outputhost.groupconsumer import GroupConsumer

    now = int(time.time() * 1000)
    queue = Queue(name="q", config=QueueConfig(), created_at=0.0)
    group = Group(queue="q", name="g", config=GroupConfig(), created_at=0.0, start_ms=0, dlq="d")
    extent = Extent(
        id="e", queue="q", kind="plain", status="open", input_host="i", stores=["s"],
        created_at=0.0,
    )  # fmt: skip

    async def no_dlq(*_: object) -> None:
        raise AssertionError("nothing goes to the DLQ here")

    async def run() -> None:
        consumer = GroupConsumer(queue, group, None, no_dlq, itertools.count(1))  # type: ignore[arg-type]
        cursor = ExtentCursor(extent, AckLevel(queue="q", group="g", extent="e"))
        consumer.cursors["e"] = cursor
        # 30 s, 2 s and 20 ms old, and one from the future (age 0): 4, 3, 2 and 1 messages
        ages_ms = [30_000] * 4 + [2_000] * 3 + [20] * 2 + [-5_000]
        records = [Record(now - a, now, b"x") for a in ages_ms]  # all due now
        keys = plain_keys(1, len(records))
        run = _run(cursor, keys, records, [f"e:{i}" for i in range(1, 11)])
        assert run.ordinal == 0 and len(run) == 10
        await consumer.window.admit(run)
        taken = consumer.take(100, None)
        assert consumer.ack([e.no for e in taken][:9]) == []
        hist = consumer.end_to_end
        assert hist.count == 9 and consumer.acked == 9
        got = dict(zip(hist.bounds, hist.counts, strict=False))
        assert got[0.05] == 2 and got[5.0] == 3 and got[60.0] == 4
        assert 4 * 30 + 3 * 2 <= hist.sum < 4 * 31 + 3 * 3
        assert cursor.ack.level == keys[8] and cursor.ack.acked == 9
        assert consumer.ack([taken[9].no]) == [] and hist.counts[0] == 1  # age 0: first bucket

    asyncio.run(run())
