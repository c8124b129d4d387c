"""The ordering-key gate of a group (roles/outputhost/keygate.py), as logic: a key's
messages one at a time and in read order, across extents by how far each was read."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from cherami.metadata.models import AckLevel, Extent, Group, GroupConfig, Queue, QueueConfig
from cherami.roles.outputhost.entry import Entry, Run
from cherami.roles.outputhost.extentreader import ExtentCursor, _run
from cherami.roles.outputhost.keygate import KeyGate
from cherami.roles.outputhost.readwindow import ReadWindow
from cherami.roles.outputhost.redelivery import Redeliveries
from cherami.wire.keys import plain_key
from cherami.wire.records import Record
from cherami.wire.store import PLAIN

if TYPE_CHECKING:
    from cherami.roles.storehost.directory import StoreDirectory


def _cursor(extent_id: str, created_s: float = 0.0) -> ExtentCursor:
    extent = Extent(id=extent_id, queue="q", kind=PLAIN, status="open", input_host="i",
                    stores=["s"], created_at=created_s)  # fmt: skip
    return ExtentCursor(extent, AckLevel(queue="q", group="g", extent=extent_id))


def _entry(cursor: ExtentCursor, seq: int, key: str | None, enqueued_ms: int = 0) -> Entry:
    record = Record(enqueued_ms, enqueued_ms, f"{cursor.id}/{seq}".encode(), key=key)
    return Entry(cursor, seq, f"{cursor.id}:{seq}", record, plain_key(seq))


def _bodies(entries: list[Entry]) -> list[str]:
    return [e.record.body.decode() for e in entries]


def test_a_key_waits_for_its_holder_and_others_pass() -> None:
    ready: list[Entry] = []
    gate = KeyGate(ready.extend)
    a = _cursor("a")
    entries = [_entry(a, 1, "k"), _entry(a, 2, "k"), _entry(a, 3, "j"), _entry(a, 4, None),
               _entry(a, 5, "k")]  # fmt: skip
    assert _bodies(gate.admit(entries)) == ["a/1", "a/3", "a/4"]
    assert gate.top() == [("k", 3), ("j", 1)]
    assert gate.admit([entries[0]]) == [entries[0]]  # the holder, delivered again
    gate.done([entries[2], entries[3]])  # j's holder and an unkeyed one: nothing waits
    assert ready == []
    gate.done([entries[0]])
    assert _bodies(ready) == ["a/2"]
    gate.done_at("a", plain_key(2))  # known by where it is stored (a parked one)
    assert _bodies(ready) == ["a/2", "a/5"]
    gate.done([entries[4]])
    assert not gate and gate.top() == []


def test_a_host_not_serving_the_group_whole_lets_no_keyed_message_go() -> None:
    """In a cluster, a host holding a keyed queue's group extent by extent (before it
    saw the queue marked keyed) holds every keyed message back, read one by one or as
    a batch, and the unkeyed ones of the same extent behind it (delivered and acked
    here, they would be delivered again by the host that takes the group whole, which
    reads from the ack level below the keyed one); unkeyed ones before it and of other
    extents go on. Served whole, they join their keys in order."""
    ready: list[Entry] = []
    a, b = _cursor("a"), _cursor("b")
    gate = KeyGate(ready.extend, {"a": a, "b": b})
    whole = False
    gate.whole = lambda: whole
    entries = [_entry(a, 0, None), _entry(a, 1, "k"), _entry(a, 2, None), _entry(a, 3, "k"),
               _entry(a, 4, "j")]  # fmt: skip
    assert _bodies(gate.admit_read(entries[:3])) == ["a/0"]
    assert _bodies(gate.admit(entries[3:])) == []
    assert _bodies(gate.admit_read([_entry(b, 1, None)])) == ["b/1"]
    assert not gate.holds_back(_entry(b, 2, None)) and a in gate.waiting_in
    assert gate.holds_back(_entry(a, 5, None))
    gate.read()
    assert ready == [] and gate.pending and not gate
    assert gate.top() == [("k", 2), ("j", 1)]
    whole = True
    b.seen_ms = 10  # read past them
    gate.read()
    # a/3 waits behind a/1
    assert _bodies(ready) == ["a/1", "a/2", "a/4", "a/5"] and not gate.pending


async def test_unkeyed_runs_wait_behind_a_keyed_message_of_their_extent_on_a_partial_host() -> None:
    """The read window's fast path (a run with no keyed record goes to ready whole)
    holds a run of an extent whose keyed message waits on a host not serving the group
    whole: at a queue's first keyed message in a cluster, 42-50 messages of the 200 a
    second were delivered twice (benchmarks/keys_changeover.py), the ones the old holder
    delivered after the keyed one."""
    a = _cursor("a")
    gate = KeyGate(lambda _: None, {"a": a})
    gate.whole = lambda: False
    queue = Queue(name="q", config=QueueConfig(), created_at=0)
    group = Group(queue="q", name="g", config=GroupConfig(), created_at=0, start_ms=0, dlq="d")
    window = ReadWindow("q/g", queue, group, {"a": a}, cast(Redeliveries, None), gate, 20_000)
    parked = SimpleNamespace(skip={})
    window._parked = cast(Redeliveries, parked)

    def run(first: int, keys: list[str | None]) -> Run:
        now = int(time.time() * 1000)
        records = [Record(now, now, f"a/{first + i}".encode(), key=k) for i, k in enumerate(keys)]
        seqs = range(first, first + len(keys))
        return _run(a, [plain_key(n) for n in seqs], records, [f"a:{n}" for n in seqs])

    await window.admit(run(1, [None, None]))
    assert len(window.ready) == 1  # the run, whole
    await window.admit(run(3, ["k", None]))
    await window.admit(run(5, [None, None]))
    assert len(window.ready) == 1 and gate.waiting() == 4


class _EmptyStores:
    """Store hosts with nothing after any position (a probe finds nothing)."""

    def get(self, store_id: str) -> _EmptyStores:
        return self

    async def read(self, extent: str, key: bytes, count: int) -> SimpleNamespace:
        return SimpleNamespace(keys=[])


async def test_an_extent_whose_reader_waits_on_a_read_after_a_full_one_is_probed() -> None:
    """The other extent's last read was full (not ``tailing``), ending with a record
    stamped in the same ms as the waiting message; its reader then waits on a tail read
    that may last minutes. It is probed all the same, and the message goes on (before:
    it waited for that read to end, a backlog's last keyed messages stuck for minutes)."""
    ready: list[Entry] = []
    a, b = _cursor("a"), _cursor("b")
    gate = KeyGate(ready.extend, {"a": a, "b": b}, lambda: cast("StoreDirectory", _EmptyStores()))
    b.seen_ms, b.tailing, b.in_read = 1000.0, False, True
    assert gate.admit([_entry(a, 1, "k", enqueued_ms=1000)]) == []
    for _ in range(5):
        await asyncio.sleep(0)
    assert _bodies(ready) == ["a/1"] and not gate.pending
    b.in_read = False  # reading (what it read not admitted yet): not probed
    later = int(b.seen_ms) + 60_000  # (the probe moved it to when it asked)
    assert gate.admit([_entry(a, 2, "j", enqueued_ms=later)]) == []
    for _ in range(5):
        await asyncio.sleep(0)
    assert gate.pending and _bodies(ready) == ["a/1"]


def test_a_message_of_an_extent_read_past_by_the_others_joins_at_once() -> None:
    a, b = _cursor("a"), _cursor("b")
    gate = KeyGate(lambda _: None, {"a": a, "b": b})
    a.seen_ms = 1000.0
    early = _entry(b, 1, "k", enqueued_ms=500)
    assert gate.admit([early]) == [early]
    assert not gate.pending


def test_pending_messages_join_in_order_once_the_other_extent_is_read_past_them() -> None:
    ready: list[Entry] = []
    a, b = _cursor("a"), _cursor("b")
    gate = KeyGate(ready.extend, {"a": a, "b": b})
    late = _entry(b, 1, "k", enqueued_ms=2000)  # k moved to b
    also = _entry(b, 2, "j", enqueued_ms=2001)
    unkeyed = _entry(b, 3, None, enqueued_ms=2002)
    assert gate.admit([late, also, unkeyed]) == [unkeyed]
    assert gate.pending and gate.top() == [("k", 1), ("j", 1)]
    early = _entry(a, 7, "k", enqueued_ms=1500)  # read from a afterwards: k's earlier one
    b.seen_ms = 2002.0
    assert gate.admit([early]) == [early]
    a.seen_ms = 2000.0
    gate.read()
    assert ready == []  # a not yet past 2000 (a record stamped at 2000 may follow)
    a.seen_ms = 2002.0
    gate.read()
    assert _bodies(ready) == ["b/2"]  # j's; k's waits for its holder a/7
    gate.done([early])
    assert _bodies(ready) == ["b/2", "b/1"]


def test_an_extent_read_to_its_end_or_made_after_a_message_is_not_waited_for() -> None:
    ready: list[Entry] = []
    a, b, c = _cursor("a"), _cursor("b"), _cursor("c", created_s=100.0)
    cursors = {"a": a, "b": b, "c": c}
    gate = KeyGate(ready.extend, cursors)
    a.read_done = True
    first = _entry(b, 1, "k", enqueued_ms=50_000)  # c was made 50 s after it
    assert gate.admit([first]) == [first]
    later = _entry(b, 2, "j", enqueued_ms=100_000)
    assert gate.admit([later]) == []
    del cursors["c"]  # c went to another host (GroupConsumer.drop_extent)
    gate.drop_cursor(c)
    assert _bodies(ready) == ["b/2"]


def test_a_read_batch_is_admitted_at_once_as_one_by_one_and_waits_when_behind() -> None:
    """``admit_read`` (the hot path of a read) decides as ``admit`` does, message by
    message, and falls back to it when another extent is not read past the latest."""
    a, b = _cursor("a"), _cursor("b")
    gate, alone = KeyGate(lambda _: None, {"a": a, "b": b}), KeyGate(lambda _: None)
    batch = [_entry(a, 1, "k", 10), _entry(a, 2, None, 11), _entry(a, 3, "k", 12),
             _entry(a, 4, "j", 13)]  # fmt: skip
    b.seen_ms = 20.0
    assert gate.admit_read(batch) == alone.admit(batch) == [batch[0], batch[1], batch[3]]
    assert gate.top() == alone.top() == [("k", 2), ("j", 1)]
    assert gate.admit_read([batch[0]]) == [batch[0]]  # the holder, read again
    late = [_entry(a, 5, "x", 19), _entry(a, 6, "y", 21)]  # b not read past 21
    assert gate.admit_read(late) == [late[0]]
    assert gate.pending and gate.top()[-1] == ("y", 1)


async def test_messages_due_again_that_all_wait_at_the_gate_leave_the_window_unreadable() -> None:
    """A parked keyed message due while its key is held (or while a failover's parked
    rows are resolved) goes to wait at the gate: ``readable`` stays clear. It was set
    over an empty ready queue, and every stream's pump then looped on it without ever
    yielding: the node answered nothing more (the restart of the SIGKILL test never
    became healthy)."""
    a = _cursor("a")
    gate = KeyGate(lambda _: None)
    queue = Queue(name="q", config=QueueConfig(), created_at=0)
    group = Group(queue="q", name="g", config=GroupConfig(), created_at=0, start_ms=0, dlq="d")
    window = ReadWindow("q/g", queue, group, {"a": a}, cast(Redeliveries, None), gate, 20_000)
    holder, later = _entry(a, 1, "k"), _entry(a, 2, "k")
    assert gate.admit([holder]) == [holder]
    window.put_first([later])  # due again while k is held
    assert not window.ready and not window.readable.is_set()
    window.put_first([_entry(a, 3, None)])
    assert len(window.ready) == 1 and window.readable.is_set()


async def test_messages_waiting_for_another_extent_leave_its_reader_room() -> None:
    """A key moved to a successor extent: the successor's reader filled the read window
    with messages that wait (pending) until the sealed extent is read past them, and the
    sealed extent's reader, back from a replica that was SIGKILLed, found no room: nothing
    in the window could be delivered or acked, so no room ever came (every key of the
    store-host SIGKILL test stuck after its 31st message, 120 s, under the suite's load).
    Messages waiting for other extents do not count against a reader's room; its own do."""
    old, new = _cursor("old"), _cursor("new")
    cursors = {"old": old, "new": new}
    gate = KeyGate(lambda _: None, cursors)
    queue = Queue(name="q", config=QueueConfig(), created_at=0)
    group = Group(queue="q", name="g", config=GroupConfig(), created_at=0, start_ms=0, dlq="d")
    window = ReadWindow("q/g", queue, group, cursors, cast(Redeliveries, None), gate, 10)
    window._parked = cast(Redeliveries, SimpleNamespace(skip={}))
    old.seen_ms = 1.0  # read as far as what was enqueued before the successor's
    now = int(time.time() * 1000)
    records = [Record(now, now, f"new/{n}".encode(), key=f"k{n}") for n in range(10)]
    await window.admit(_run(new, [plain_key(n) for n in range(10)], records,
                            [f"new:{n}" for n in range(10)]))  # fmt: skip
    assert not window.ready and gate.waiting_in == {new: None}.keys()
    room = await asyncio.wait_for(window.wait_for_room(old), 1.0)
    assert room == 10  # the old extent's reader goes on
    waiting = asyncio.ensure_future(window.wait_for_room(new))
    await asyncio.sleep(0)  # (a turn of the loop: it waits, its own fill the window)
    assert not waiting.done()
    window.stop()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
