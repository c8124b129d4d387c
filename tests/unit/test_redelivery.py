"""Parked messages: a row is written before the cursor passes a message and again when a
redelivery is handed to a consumer (never before); acks and the DLQ delete it; loading
rows after a restart."""

from __future__ import annotations

import itertools
import time
from typing import Any

import msgspec

from cherami import timing
from cherami.context import ProcessContext
from cherami.metadata.models import (
    AckLevel,
    Extent,
    Fence,
    Group,
    GroupConfig,
    Queue,
    QueueConfig,
    Redelivery,
)
from cherami.roles.outputhost import groupconsumer as gc
from cherami.roles.outputhost.entry import Entry, Run
from cherami.roles.outputhost.extentreader import ExtentCursor, _run
from cherami.roles.outputhost.redelivery import (
    DUE,
    OUT,
    PARKING,
    WAITING,
    Redeliveries,
    key_before,
    write,
)
from cherami.wire.keys import plain_key
from cherami.wire.records import Record
from cherami.wire.store import PLAIN


class _Metadata:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, bytes], Redelivery] = {}
        self.writes = 0
        self.fail = False

    async def put_redeliveries(
        self, upserts: list[Redelivery], deletes: list[Redelivery], fence: Fence | None = None
    ) -> None:
        if self.fail:
            raise OSError("metadata is down")
        self.writes += 1
        for row in deletes:
            self.rows.pop((row.extent, row.key), None)
        for row in upserts:
            self.rows[(row.extent, row.key)] = row


def _cursor(level: bytes = b"") -> ExtentCursor:
    extent = Extent(id="e1", queue="q", kind=PLAIN, status="open", input_host="i",
                    stores=["s1"], created_at=0.0)  # fmt: skip
    return ExtentCursor(extent, AckLevel(queue="q", group="g", extent="e1", level=level))


def _read_run(cursor: ExtentCursor, seqs: range) -> Run:
    keys = [plain_key(s) for s in seqs]
    now_ms = int(time.time() * 1000)
    records = [Record(now_ms, now_ms, f"m{s}".encode()) for s in seqs]
    return _run(cursor, keys, records, [f"e1:{s}" for s in seqs])


def _read(cursor: ExtentCursor, seqs: range) -> list[Entry]:
    return _read_run(cursor, seqs).entries()


class _Parked:
    def __init__(self, max_bodies: int = 10) -> None:
        self.covered: list[Entry] = []
        self.ready: list[Entry] = []
        self.set = Redeliveries("q", "g", self._cover, self.ready.extend, max_bodies)

    def _cover(self, entry: Entry) -> None:
        self.covered.append(entry)
        entry.cursor.ack.ack(entry.ordinal)


async def test_a_parked_message_is_passed_by_its_cursor_only_once_its_row_is_written() -> None:
    cursor = _cursor()
    (entry,) = _read(cursor, range(1, 2))
    entry.count = 1
    p, meta = _Parked(), _Metadata()
    p.set.park(entry, due_ms=5000)
    assert entry.row is not None and entry.row.state == PARKING
    assert cursor.ack.level == b"" and not p.covered
    await write(meta, [p.set], None)  # type: ignore[arg-type]
    assert meta.rows[("e1", plain_key(1))].count == 1
    assert meta.rows[("e1", plain_key(1))].due_ms == 5000
    assert p.covered == [entry] and cursor.ack.level == plain_key(1)
    assert entry.row.state == WAITING and p.set.due(4999) == []
    (due,) = p.set.due(5000)
    assert due.state == DUE and due.entry is entry
    p.set.release([due])  # ready again at once: nothing is counted before a consumer has it
    assert p.ready == [entry] and due.state == OUT and entry.count == 1 and not p.set.pending
    entry.count += 1  # what take() does as a consumer is handed it
    p.set.delivered([entry])
    assert p.set.pending
    await write(meta, [p.set], None)  # type: ignore[arg-type]
    assert meta.rows[("e1", plain_key(1))].count == 2  # the delivery handed out is counted
    p.set.delivered([entry])  # the same delivery again: nothing more to write
    assert not p.set.pending
    p.set.forget(due)  # acked
    assert entry.row is None and not p.set.rows
    await write(meta, [p.set], None)  # type: ignore[arg-type]
    assert meta.rows == {} and meta.writes == 3


async def test_a_failed_write_is_made_again_and_nothing_moves_meanwhile() -> None:
    cursor = _cursor()
    (entry,) = _read(cursor, range(1, 2))
    p, meta = _Parked(), _Metadata()
    p.set.park(entry, due_ms=0)
    meta.fail = True
    try:
        await write(meta, [p.set], None)  # type: ignore[arg-type]
    except OSError:
        pass
    assert p.set.pending and not p.covered and p.set.due(10) == []
    meta.fail = False
    await write(meta, [p.set], None)  # type: ignore[arg-type]
    assert p.covered == [entry] and len(p.set.due(10)) == 1


async def test_a_change_made_while_a_write_is_under_way_is_written_next() -> None:
    cursor = _cursor()
    (entry,) = _read(cursor, range(1, 2))
    entry.count = 1
    p, meta = _Parked(), _Metadata()
    p.set.pin(entry, due_ms=60_000)  # held at the head of a full window
    batch = p.set.collect()
    p.set.park(entry, due_ms=100)  # nacked while the pin is being written
    await meta.put_redeliveries(batch.upserts, batch.deletes)
    p.set.written(batch)
    assert cursor.ack.level == plain_key(1)  # a row holds it either way
    assert entry.row is not None and entry.row.state == PARKING and p.set.pending
    await write(meta, [p.set], None)  # type: ignore[arg-type]
    assert meta.rows[("e1", plain_key(1))].due_ms == 100 and len(p.set.due(100)) == 1


async def test_bodies_beyond_the_limit_are_dropped_and_read_again_by_key() -> None:
    cursor = _cursor()
    entries = _read(cursor, range(1, 6))
    p, meta = _Parked(max_bodies=2), _Metadata()
    for entry in entries:
        p.set.park(entry, due_ms=0)
    await write(meta, [p.set], None)  # type: ignore[arg-type]
    assert p.set.bodies == 2
    due = p.set.due(0)
    assert [d.entry is not None for d in due] == [True, True, False, False, False]
    assert p.set.bodies == 0


def test_loaded_rows_wait_until_due_and_rows_above_the_level_are_passed_over() -> None:
    rows = [
        Redelivery(queue="q", group="g", extent="e1", key=plain_key(2), count=1, due_ms=900),
        Redelivery(queue="q", group="g", extent="e1", key=plain_key(7), count=3, due_ms=900),
    ]
    p = _Parked()
    p.set.load(rows, {"e1"}, {"e1": plain_key(5)}, max_count=3, now_ms=100)
    assert p.set.skip == {"e1": {plain_key(7)}}
    (poison,) = p.set.due(100)  # at the delivery limit: due at once (to the DLQ)
    assert poison.key == plain_key(7) and poison.entry is None
    assert [d.key for d in p.set.due(900)] == [plain_key(2)]
    cursor = _cursor(level=plain_key(5))
    read = _read(cursor, range(6, 9))
    kept = p.set.pass_over(read)
    assert [e.key for e in kept] == [plain_key(6), plain_key(8)]
    assert p.covered == [read[1]] and p.set.skip == {}
    p.set.load(rows, {"e1"}, {}, max_count=3, now_ms=100)  # loaded once
    assert len(p.set.rows) == 2


def test_rows_belong_to_their_extent() -> None:
    rows = [
        Redelivery(queue="q", group="g", extent=e, key=plain_key(2), count=1, due_ms=900)
        for e in ("e1", "e2")
    ]
    p = _Parked()
    p.set.load(rows, {"e1"}, {}, max_count=3, now_ms=100)  # only the extents taken here
    assert set(p.set.rows) == {("e1", plain_key(2))} and p.set.loaded == {"e1"}
    p.set.load(rows, {"e1", "e2"}, {}, max_count=3, now_ms=100)
    assert len(p.set.rows) == 2
    for extent in ("e1", "e2"):  # each gets a change to write
        p.set.forget(p.set.rows[(extent, plain_key(2))])
    assert p.set.pending_extents() == {"e1", "e2"}
    batch = p.set.collect({"e1"})  # written under e1's fence
    assert [r.extent for r in batch.deletes] == ["e1"]
    p.set.drop_extent("e2")  # e2 went to another host: nothing of it is written here
    assert not p.set.pending and p.set.loaded == {"e1"}
    assert p.set.due(1000) == []


def test_key_before() -> None:
    assert key_before(plain_key(1)) == plain_key(0)
    assert key_before(plain_key(256)) == plain_key(255)
    assert key_before(plain_key(0)) == b""
    assert key_before(bytes(8) + plain_key(1)) == bytes(16)


def _consumer(max_count: int = 3, read_ahead: int = timing.DEFAULT.read_ahead) -> gc.GroupConsumer:
    queue = Queue(name="q", config=QueueConfig(), created_at=0.0)
    group = Group(queue="q", name="g", config=GroupConfig(max_delivery_count=max_count),
                  created_at=0.0, start_ms=0, dlq="_dlq")  # fmt: skip
    dead: list[list[Entry]] = []

    async def dead_letter(_: Any, entries: list[Entry]) -> None:
        dead.append(entries)

    reads: Any = None
    ctx = ProcessContext(timing=msgspec.structs.replace(timing.DEFAULT, read_ahead=read_ahead))
    consumer = gc.GroupConsumer(queue, group, reads, dead_letter, itertools.count(1), ctx=ctx)
    consumer.cursors["e1"] = _cursor()
    return consumer


async def test_a_nacked_message_leaves_the_window_and_is_counted_once_redelivered() -> None:
    consumer, meta = _consumer(), _Metadata()
    cursor = consumer.cursors["e1"]
    await consumer.window.admit(_read_run(cursor, range(1, 4)))
    first, second, third = consumer.take(3, 30.0)
    assert meta.writes == 0  # first deliveries write nothing
    consumer.nack([first.no], delay=3600.0)
    consumer.ack([second.no, third.no])
    assert cursor.ack.window() == 3 and not consumer.ready
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert cursor.ack.window() == 0 and cursor.ack.acked == 3  # the window is free
    (row,) = meta.rows.values()
    assert row.count == 1 and row.due_ms > 3_000_000
    consumer._release_due(row.due_ms)
    assert list(consumer.ready) == [first] and not consumer.parked.pending  # nothing counted
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert meta.rows[("e1", plain_key(1))].count == 1  # ready, not delivered: a crash keeps 1
    (again,) = consumer.take(1, 30.0)
    assert again is first and again.count == 2
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert meta.rows[("e1", plain_key(1))].count == 2  # handed out: counted
    consumer.ack([again.no])
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert meta.rows == {}


async def test_a_poison_message_goes_to_the_dlq_and_its_row_after_it() -> None:
    consumer, meta = _consumer(max_count=1), _Metadata()
    await consumer.window.admit(_read_run(consumer.cursors["e1"], range(1, 2)))
    (entry,) = consumer.take(1, 30.0)
    consumer.nack([entry.no], delay=3600.0)  # at the limit: due at once, not in an hour
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert meta.rows[("e1", plain_key(1))].count == 1
    consumer._release_due(meta.rows[("e1", plain_key(1))].due_ms)
    assert consumer.dead.task is not None
    await consumer.dead.task
    assert consumer.dead_lettered == 1 and not consumer.ready
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert meta.rows == {}


async def test_a_delivery_held_at_the_head_of_a_full_window_is_pinned(monkeypatch: Any) -> None:
    consumer, meta = _consumer(read_ahead=3), _Metadata()
    cursor = consumer.cursors["e1"]
    await consumer.window.admit(_read_run(cursor, range(1, 4)))
    held, *rest = consumer.take(3, 30.0)
    consumer.ack([e.no for e in rest])
    consumer._pin_held(0.0)  # seen at the head once: not yet
    assert held.row is None
    consumer._pin_held(1.0)  # still there: it gets a row and stays in flight
    assert held.row is not None and held.no in consumer.flight.entries
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert cursor.ack.window() == 0 and meta.rows[("e1", plain_key(1))].count == 1
    consumer.ack([held.no])
    await write(meta, [consumer.parked], None)  # type: ignore[arg-type]
    assert meta.rows == {}
