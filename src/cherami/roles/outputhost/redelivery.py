"""A consumer group's parked messages: delivered, not acked, waiting to be delivered again.

A delivery that ends without an ack (a nack with any delay, a visibility timeout, its
stream closing) parks the message: its redelivery row (metadata: deliveries so far, when
it is due) is written, and only once that write succeeded is the message acked in its
extent cursor, so the ack level and the read window move past it. A delivery held in
flight at the head of a full read window is pinned the same way (a row, then the cursor
ack) and stays in flight. When a parked message is due it is made ready at once, its
count unchanged (``release``); a message already at max_delivery_count goes to the DLQ
instead. A delivery is counted when a consumer takes it (``delivered``: an HTTP
receive's answer, a stream's deliver frame): its row is written again with that count
in the next flush, so a crash never counts a delivery that no consumer was handed. An
ack or the move to the DLQ deletes the row. A first delivery writes nothing.

Rows belong to their extent: an output host loads and writes only the rows of the
extents it holds (ownership.py), and forgets those of an extent it loses without
writing anything (``drop_extent``). Rows are written in the output host's periodic
flush, batched (``write``), each extent's under its extent's fence. At most
``max_bodies`` waiting messages keep their bodies in memory; the others are read again
from a store host by key when due (``read_one``)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from cherami.errors import CheramiError, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Extent, Fence, Redelivery
from cherami.roles.outputhost.entry import Delivered, Entry
from cherami.roles.storehost.client import StoreError
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.records import Record, decode_record

MAX_BODIES = 10_000  # waiting messages whose bodies stay in memory, per group

# states of a parked message
PARKING = "parking"  # its row is being written; then it waits
WAITING = "waiting"  # in the timer heap until due
DUE = "due"  # taken off the heap: being read by key, released or dead-lettered
OUT = "out"  # ready or in flight (or on its way to the DLQ), with a row
GONE = "gone"  # acked, dead-lettered or dropped: its row is being deleted

Key = tuple[str, bytes]  # extent, storage key


class Parked:
    __slots__ = ("extent", "key", "count", "due_ms", "entry", "state", "version", "covered")

    def __init__(self, extent: str, key: bytes, count: int, due_ms: int, state: str) -> None:
        self.extent = extent
        self.key = key
        self.count = count  # deliveries counted (the row's count)
        self.due_ms = due_ms
        self.entry: Entry | None = None  # None while its body is not in memory
        self.state = state
        self.version = 0  # grows with every change queued for writing
        self.covered = False  # its row is written: its cursor may have passed it


@dataclass(slots=True)
class Batch:
    upserts: list[Redelivery]
    deletes: list[Redelivery]
    written: list[tuple[Parked, int]]  # each upserted message and its version then


class Redeliveries:
    def __init__(
        self,
        queue: str,
        group: str,
        covered: Callable[[Entry], None],
        ready: Callable[[list[Entry]], None],
        max_bodies: int = MAX_BODIES,
    ) -> None:
        """``covered`` acks an entry in its cursor once a row holds it; ``ready`` takes
        entries due again (``release``)."""
        self.queue = queue
        self.group = group
        self._covered = covered
        self._ready = ready
        self._max_bodies = max_bodies
        self.rows: dict[Key, Parked] = {}
        self.skip: dict[str, set[bytes]] = {}  # extent -> keys its reader must pass over
        self.loaded: set[str] = set()  # extents whose rows are loaded
        self.bodies = 0
        self._heap: list[tuple[int, int, Parked]] = []
        self._tie = itertools.count()
        self._upserts: dict[Key, Parked] = {}
        self._deletes: dict[Key, Redelivery] = {}
        self.on_pending: Callable[[], None] = lambda: None  # a change waits to be written
        self.on_waiting: Callable[[], None] = lambda: None  # a message waits to be due

    @property
    def pending(self) -> bool:
        return bool(self._upserts or self._deletes)

    def pending_extents(self) -> set[str]:
        return {k[0] for k in self._upserts} | {k[0] for k in self._deletes}

    def drop_extent(self, extent: str) -> None:
        """The extent went to another output host: forget its rows here, writing
        nothing (they are the new holder's now)."""
        for key in [k for k in self.rows if k[0] == extent]:
            parked = self.rows.pop(key)
            if parked.entry is not None:
                if parked.state == WAITING:
                    self.bodies -= 1
                parked.entry.row = None
            parked.state = GONE
            parked.version += 1  # a write under way does not act on it any more
        for pending in (self._upserts, self._deletes):
            for key in [k for k in pending if k[0] == extent]:
                del pending[key]
        self.skip.pop(extent, None)
        self.loaded.discard(extent)

    # changes
    def park(self, entry: Entry, due_ms: int) -> None:
        """Its delivery ended without an ack: write its row, then wait until due."""
        self._write(entry, due_ms, PARKING)

    def pin(self, entry: Entry, due_ms: int) -> None:
        """It is held in flight at the head of a full read window: write its row so the
        cursor may pass it; the delivery goes on."""
        self._write(entry, due_ms, OUT)

    def _write(self, entry: Entry, due_ms: int, state: str) -> None:
        parked = entry.row
        if parked is None:
            parked = Parked(entry.cursor.id, entry.key, entry.count, due_ms, state)
            entry.row = parked
            self.rows[(parked.extent, parked.key)] = parked
        parked.entry = entry
        parked.count = entry.count
        parked.due_ms = due_ms
        parked.state = state
        self._queue(parked)

    def release(self, due: list[Parked]) -> None:
        """Due messages (below the delivery limit) are ready again, their counts as
        their rows say: nothing is written until a consumer takes one (``delivered``)."""
        entries = []
        for parked in due:
            assert parked.entry is not None
            parked.entry.count = parked.count  # take() counts the delivery in memory
            parked.state = OUT
            entries.append(parked.entry)
        if entries:
            self._ready(entries)

    def delivered(self, taken: list[Entry | Delivered]) -> None:
        """Consumers were handed these deliveries (an entry's ``count`` counts its
        delivery): the rows of the redelivered ones say so from the next flush on."""
        for entry in taken:
            if isinstance(entry, Delivered) or (parked := entry.row) is None:
                continue  # a run, or a first delivery: nothing to write
            if parked.state == OUT and parked.count < entry.count:
                parked.count = entry.count
                self._queue(parked)

    def retry(self, parked: Parked, due_ms: int) -> None:
        """Its body could not be read now: wait again."""
        parked.due_ms = due_ms
        parked.state = WAITING
        heapq.heappush(self._heap, (due_ms, next(self._tie), parked))
        self.on_waiting()

    def forget(self, parked: Parked) -> None:
        """Acked, dead-lettered, expired or its extent is gone: delete its row."""
        key = (parked.extent, parked.key)
        if self.rows.get(key) is parked:
            del self.rows[key]
        if parked.entry is not None:
            parked.entry.row = None
            if parked.state == WAITING:
                self.bodies -= 1
        self._upserts.pop(key, None)
        parked.state = GONE
        parked.version += 1  # a write under way does not act on it any more
        self._deletes[key] = self._row(parked)
        self.on_pending()

    def _queue(self, parked: Parked) -> None:
        parked.version += 1
        self._upserts[(parked.extent, parked.key)] = parked
        self.on_pending()

    def _row(self, parked: Parked) -> Redelivery:
        return Redelivery(
            queue=self.queue, group=self.group, extent=parked.extent, key=parked.key,
            count=parked.count, due_ms=parked.due_ms,
        )  # fmt: skip

    # timers
    def next_due_ms(self) -> int | None:
        """When the first waiting message is due (an entry taken off since may come
        first: a wake-up too early, never too late)."""
        return self._heap[0][0] if self._heap else None

    def due(self, now_ms: int) -> list[Parked]:
        """Waiting messages whose time has come, taken off the heap (state DUE)."""
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now_ms:
            due_ms, _, parked = heapq.heappop(heap)
            if parked.state != WAITING or parked.due_ms != due_ms:
                continue  # parked again since, or gone
            parked.state = DUE
            if parked.entry is not None:
                self.bodies -= 1
            out.append(parked)
        return out

    def _wait(self, parked: Parked) -> None:
        parked.state = WAITING
        if parked.entry is not None:
            if self.bodies >= self._max_bodies:
                parked.entry.row = None
                parked.entry = None  # read again by key when due
            else:
                self.bodies += 1
        heapq.heappush(self._heap, (parked.due_ms, next(self._tie), parked))
        self.on_waiting()

    # writing
    def collect(self, extents: set[str] | None = None) -> Batch:
        """The changes to write now, of ``extents`` only unless None (``written`` or
        ``failed`` tells how it went)."""
        if extents is None:
            upserts = list(self._upserts.values())
            deletes = list(self._deletes.values())
            self._upserts, self._deletes = {}, {}
        else:
            upserts = [self._upserts.pop(k) for k in list(self._upserts) if k[0] in extents]
            deletes = [self._deletes.pop(k) for k in list(self._deletes) if k[0] in extents]
        return Batch([self._row(p) for p in upserts], deletes, [(p, p.version) for p in upserts])

    def written(self, batch: Batch) -> None:
        for parked, version in batch.written:
            parked.covered = True
            entry = parked.entry
            if entry is not None and entry.ordinal >= 0:
                self._covered(entry)  # a row holds it: the cursor may pass it
            if parked.version != version:
                continue  # changed again since: that write acts
            if parked.state == PARKING:
                self._wait(parked)

    def failed(self, batch: Batch) -> None:
        """Write the same changes again next time (unless changed since)."""
        for parked, version in batch.written:
            if parked.version == version:
                self._upserts.setdefault((parked.extent, parked.key), parked)
        for row in batch.deletes:
            key = (row.extent, row.key)
            if key not in self.rows:
                self._deletes.setdefault(key, row)
        if self.pending:
            self.on_pending()

    # loading
    def load(
        self,
        rows: list[Redelivery],
        extents: set[str],
        levels: dict[str, bytes],
        max_count: int,
        now_ms: int,
    ) -> None:
        """The rows of ``extents`` as this host takes them: each waits until due (at
        once when it is at the delivery limit). A row above its extent's ack level (the
        host stopped between the row's write and the level's) is passed over by the
        extent's reader."""
        extents = extents - self.loaded
        self.loaded |= extents
        for row in rows:
            key = (row.extent, row.key)
            if row.extent not in extents or key in self.rows:
                continue
            due_ms = min(row.due_ms, now_ms) if row.count >= max_count else row.due_ms
            parked = Parked(row.extent, row.key, row.count, due_ms, WAITING)
            parked.covered = True
            self.rows[key] = parked
            heapq.heappush(self._heap, (due_ms, next(self._tie), parked))
            if row.key > levels.get(row.extent, b""):
                self.skip.setdefault(row.extent, set()).add(row.key)

    def held(self) -> int:
        """Messages held here that their cursors count as acked (for the backlog)."""
        return sum(p.covered for p in self.rows.values())

    def pass_over(self, entries: list[Entry]) -> list[Entry]:
        """Entries just read, less those the parked path delivers (acked in the cursor)."""
        kept = []
        for entry in entries:
            keys = self.skip.get(entry.cursor.id)
            if keys is None or entry.key not in keys:
                kept.append(entry)
                continue
            keys.discard(entry.key)
            if not keys:
                del self.skip[entry.cursor.id]
            self._covered(entry)
        return kept


async def write(
    metadata: MetadataStore,
    sets: list[Redeliveries],
    fence: Fence | None,
    extents: set[str] | None = None,
) -> None:
    """Write the pending rows of these groups (of ``extents`` only, unless None) in one
    transaction."""
    batches = [(s, s.collect(extents)) for s in sets if s.pending]
    if not batches:
        return
    upserts = [row for _, b in batches for row in b.upserts]
    deletes = [row for _, b in batches for row in b.deletes]
    try:
        await metadata.put_redeliveries(upserts, deletes, fence=fence)
    except BaseException:
        for parked_set, batch in batches:
            parked_set.failed(batch)
        raise
    for parked_set, batch in batches:
        parked_set.written(batch)


def key_before(key: bytes) -> bytes:
    """The key just below ``key`` (keys are fixed-length big-endian numbers)."""
    number = int.from_bytes(key, "big")
    return (number - 1).to_bytes(len(key), "big") if number else b""


async def read_one(stores: StoreDirectory, extent: Extent, key: bytes) -> Record | None:
    """The record stored under ``key``: from the first replica that has it; None when
    a replica answered that the extent (deleted by retention) or the record is gone and
    none had it; Unavailable when no replica could tell (an empty read is no answer: an
    open extent is not readable on a restarted store host until it is committed or
    sealed again)."""
    after = key_before(key)
    error: CheramiError = Unavailable(f"extent {extent.id} has no replicas")
    answered = False
    for store_id in extent.stores:
        try:
            batch = await stores.get(store_id).read(extent.id, after, 1)
        except StoreError as err:
            answered = answered or err.code == "extent_not_found"
            error = err
            continue
        except CheramiError as err:
            error = err
            continue
        if batch.keys and batch.keys[0] == key:
            return decode_record(batch.records[0])
        if batch.keys:
            answered = True  # it has what follows, not this one
        else:
            error = Unavailable(f"extent {extent.id} is not readable at {key.hex()} yet")
    if answered:
        return None
    raise error
