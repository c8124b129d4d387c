"""A consumer group's messages between read and ack: one ``Entry`` per message, or, on
the fast path of a stream, whole runs of them.

A run of messages read in a row from one extent and not delivered yet is a ``Run`` in
the group's ready queue; a stream takes its head as a ``Delivered``: consecutive
delivery numbers for consecutive messages, settled by ranges, with no object per
message. Anything a run cannot say (a nack, a visibility timeout, a redelivery row, a
closed stream, an HTTP receive) turns the run's unsettled messages into entries first
(``Run.entries``, ``Delivered.entries``), and the per-message path takes over."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from cherami.wire.records import Record
from cherami.wire.stream import DeliveryTuple

if TYPE_CHECKING:
    from cherami.roles.outputhost.extentreader import ExtentCursor
    from cherami.roles.outputhost.redelivery import Parked

BODY = attrgetter("body")
ENQUEUED = attrgetter("enqueued_ms")
DELIVERY = attrgetter("delivery_ms")
EXPIRES = attrgetter("expires_ms")
ATTRIBUTES = attrgetter("attributes")
KEY = attrgetter("key")


class Entry:
    __slots__ = (
        "cursor", "ordinal", "msg_id", "record", "key", "count", "no", "deadline", "owner", "row"
    )  # fmt: skip

    def __init__(
        self, cursor: ExtentCursor, ordinal: int, msg_id: str, record: Record, key: bytes
    ) -> None:
        self.cursor = cursor
        self.ordinal = ordinal  # in the cursor's ack tracking (-1: not tracked, read by key)
        self.msg_id = msg_id
        self.record = record
        self.key = key  # storage key in the cursor's extent
        self.count = 0  # deliveries so far
        self.no = 0  # number of the current delivery (0: not delivered now)
        self.deadline = 0.0
        self.owner: Any = None  # the stream that holds the current delivery, if any
        self.row: Parked | None = None  # its redelivery row, once it has one

    # what every holder of a tracked message says of it (ackmanager.py)
    def record_at(self, ordinal: int) -> Record:
        return self.record

    def number_at(self, ordinal: int) -> int:
        """The current delivery number of the message at ``ordinal`` (0: none)."""
        return self.no


class Run:
    """Messages read in a row from one extent (``keys[i]`` holds ``records[i]``, whose
    public id is ``ids[i]``, tracked at ordinal ``ordinal + i``), never delivered; those
    from ``pos`` on are still ready. The lists may be shared with other groups' runs
    (sharedreads.py): they are never changed."""

    __slots__ = ("cursor", "ordinal", "keys", "records", "ids", "pos")

    def __init__(
        self,
        cursor: ExtentCursor,
        ordinal: int,
        keys: list[bytes],
        records: list[Record],
        ids: list[str],
    ) -> None:
        self.cursor = cursor
        self.ordinal = ordinal
        self.keys = keys
        self.records = records
        self.ids = ids
        self.pos = 0

    def __len__(self) -> int:
        return len(self.keys) - self.pos

    def record_at(self, ordinal: int) -> Record:
        return self.records[ordinal - self.ordinal]

    def number_at(self, ordinal: int) -> int:
        return 0  # not delivered yet

    def entries(self, n: int | None = None) -> list[Entry]:
        """The next ``n`` messages still ready (all of them by default), as entries
        (which the cursor then tracks); the run keeps the rest."""
        pos, cursor = self.pos, self.cursor
        end = len(self.keys) if n is None else min(len(self.keys), pos + n)
        first = self.ordinal + pos
        made = [
            Entry(cursor, ordinal, msg_id, record, key)
            for ordinal, msg_id, record, key in zip(
                range(first, first + end - pos), self.ids[pos:end], self.records[pos:end],
                self.keys[pos:end], strict=True,
            )
        ]  # fmt: skip
        self.pos = end
        cursor.ack.hold(first, made)
        return made


class Delivered:
    """``n`` messages of one extent delivered at once to one stream: delivery number
    ``first + i`` is ``records[i]`` (tracked at ordinal ``ordinal + i``), its first
    delivery. ``settled[i]`` is set once it is acked or taken out of the run as an entry
    (``take_out``); ``left`` counts the rest."""

    __slots__ = (
        "cursor", "ordinal", "keys", "records", "ids", "first", "n", "owner", "deadline",
        "settled", "left",
    )  # fmt: skip

    def __init__(
        self,
        run: Run,
        n: int,
        first: int,
        owner: Any,
        deadline: float,
    ) -> None:
        pos = run.pos
        end = pos + n
        self.cursor = run.cursor
        self.ordinal = run.ordinal + pos
        self.keys = run.keys[pos:end]
        self.records = run.records[pos:end]
        self.ids = run.ids[pos:end]
        self.first = first
        self.n = self.left = n
        self.owner = owner
        self.deadline = deadline
        self.settled = bytearray(n)
        run.pos = end

    def record_at(self, ordinal: int) -> Record:
        return self.records[ordinal - self.ordinal]

    def number_at(self, ordinal: int) -> int:
        return self.first + ordinal - self.ordinal

    def tuples(self) -> list[DeliveryTuple]:
        """What a deliver frame says of each (wire.stream.encode_deliver), built in C."""
        records = self.records
        first, n = self.first, self.n
        return list(
            zip(
                range(first, first + n), self.ids, map(BODY, records),
                map(ATTRIBUTES, records), [1] * n, map(ENQUEUED, records), strict=True,
            )
        )  # fmt: skip

    def entries(self) -> list[Entry]:
        """The deliveries still in the run, as entries in flight (which the cursor then
        tracks); the run is empty after."""
        made = [self._entry(i) for i in range(self.n) if not self.settled[i]]
        self.settled[:] = b"\x01" * self.n
        self.left = 0
        return made

    def take_out(self, no: int) -> Entry | None:
        """Delivery ``no`` as an entry in flight, out of the run (None: not in it now)."""
        i = no - self.first
        if not 0 <= i < self.n or self.settled[i]:
            return None
        self.settled[i] = 1
        self.left -= 1
        return self._entry(i)

    def _entry(self, i: int) -> Entry:
        entry = Entry(self.cursor, self.ordinal + i, self.ids[i], self.records[i], self.keys[i])
        entry.count = 1
        entry.no = self.first + i
        entry.deadline = self.deadline
        entry.owner = self.owner
        self.cursor.ack.hold(entry.ordinal, [entry])
        return entry
