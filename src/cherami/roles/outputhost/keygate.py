"""A consumer group's ordering keys on this output host (docs/api.md, "Ordering keys").

A message with a ``key`` *holds* its key from the moment it is made ready until it is
settled for good: acked, dead-lettered, or dropped as expired. Meanwhile the later
messages of the key read here wait in the key's line (in read order, which is publish
order within an extent), outside the ready queue, so they never stand in the way of
unkeyed messages or of other keys; a nack, a visibility timeout or a closed stream parks
the holder (redelivery.py) and it keeps the key until it is delivered again and
settled. When the holder is settled for good, the next of its line is made ready.

A waiting message is read and tracked like any other: it is simply not acked yet, so
the ack level stays below it (after a failover the new holder of the extent reads it
again), and it counts in the group's read window (one pending on other extents' reads,
below, not against those extents' readers' room: readwindow.py ``wait_for_room``).

The holder is named by where it is stored (extent, storage key), not by its entry: a
parked message whose body was dropped from memory comes back as a new entry.

**Across extents.** A queue may have several open extents (scaling), and a key moves to
another extent when they change (a seal, a new extent): its earlier messages may sit
in an extent this group has not read as far. So a keyed message read from one extent
joins its key's line only once every other plain extent of the group here has been
read past the time it was enqueued (``ExtentCursor.seen_ms``: a record read with a
later enqueue time was appended after it; a read that came back short when it was
asked had everything committed before then), and once the group's extents were read
from the metadata store after that time (``known_ms``: an extent made since, not known
here yet, may hold an earlier message of the key; the output host refreshes 50 ms
after a keyed message starts waiting for it, service.py). Until then it waits in its extent's
*pending* queue, in read order. An extent that is read to its end, or was created
after the message, is not waited for; one whose reader is waiting for new records is
*probed*: one read that finds nothing after its position moves its ``seen_ms`` to when
it was asked (cost follows work: a probe only while a keyed message waits on it).

**After a failover** (or a restart) the new holder of an extent loads its parked rows:
messages delivered before, not acked, which may hold their keys. Their bodies (and so
their keys) are not in the rows, so every keyed message of the group waits (pending)
until each row's record has been read again by key and its key claimed for it
(``resolve``); then the later messages of those keys wait behind them as before.

**In a cluster** a group whose queue took keyed messages is served whole by one output
host (ownership.py ``group_units``): a host holding the group's extents one by one
(before it saw the queue marked keyed) lets no keyed message go: they wait pending,
unacked, and the host that takes the group whole reads them again."""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING

from cherami.errors import CheramiError
from cherami.roles.outputhost.redelivery import GONE, Parked, read_one
from cherami.wire.store import TIMER

if TYPE_CHECKING:
    from cherami.roles.outputhost.entry import Entry
    from cherami.roles.outputhost.extentreader import ExtentCursor
    from cherami.roles.storehost.directory import StoreDirectory

log = logging.getLogger("cherami.outputhost.keygate")

Where = tuple[str, bytes]  # extent id, storage key
TOP_KEYS = 10  # keys with the most backlog in a group's stats
PROBE_RETRY = 0.5  # seconds before a failed probe is tried again
RESOLVE_TRIES = 3  # reads of a loaded parked row's record before its key is given up
RESOLVE_AT_ONCE = 32  # such reads under way at once
CREATED_SLACK_MS = 2000  # an extent created this long after a message cannot hold it earlier


class KeyGate:
    """``ready`` takes the next message of a key whose holder was settled."""

    def __init__(
        self,
        ready: Callable[[list[Entry]], None],
        cursors: dict[str, ExtentCursor] | None = None,
        stores: Callable[[], StoreDirectory] | None = None,
    ) -> None:
        """``cursors``: the group's extent cursors (None: one extent, nothing to wait
        for); ``stores`` gives the store hosts' clients, to probe an extent whose reader
        waits for new records."""
        self._ready = ready
        self._cursors: dict[str, ExtentCursor] = {} if cursors is None else cursors
        self._stores = stores
        self.held: dict[str, Where] = {}  # key -> where its holder is stored
        self._keys: dict[Where, str] = {}  # the same, the other way round
        self._lines: dict[str, deque[Entry]] = {}  # key -> its waiting messages, in order
        self._pending: dict[ExtentCursor, deque[Entry]] = {}  # read before the others
        self._probing: dict[str, asyncio.Task[None]] = {}  # extent -> its probe
        self._resolving: set[asyncio.Task[None]] = set()  # loaded parked rows' keys
        # every extent of the queue made before this time (epoch ms) has a cursor here
        # (the output host's last extent refresh; service.py), and a callback for when
        # a message starts waiting in a pending queue (the next refresh looks again)
        self.known_ms: Callable[[], float] = lambda: math.inf
        self.on_pending: Callable[[], None] = lambda: None
        # whether this host serves the group whole (a node, a CP or keyed queue's group
        # in a cluster): one holding its extents one by one lets no keyed message go
        self.whole: Callable[[], bool] = lambda: True

    def __bool__(self) -> bool:
        return bool(self.held)

    def admit(self, entries: Iterable[Entry]) -> list[Entry]:
        """Of messages about to be made ready (read, or due again), those that may be:
        unkeyed ones, the first of a key, its holder coming back; the others wait. On a
        host holding the group's extents one by one, an unkeyed message waits too behind
        a keyed one of its extent that waits: the ack level stays below what this host
        could not deliver, so the host that takes the group whole delivers from there,
        and nothing acked here is delivered again."""
        made = []
        for e in entries:
            if e.record.key is not None:
                if self.let(e):
                    made.append(e)
            elif not (self._pending and self.holds_back(e)):
                made.append(e)
        return made

    def holds_back(self, entry: Entry) -> bool:
        """Whether an unkeyed message waits behind a keyed one of its extent (``admit``);
        if so it waits in that extent's pending queue."""
        pending = self._pending.get(entry.cursor)
        if pending is None or self.whole():
            return False
        pending.append(entry)
        return True

    def admit_read(self, entries: list[Entry]) -> list[Entry]:
        """``admit`` of messages just read from one extent, in read order: when none
        of them has to wait for another extent (``_behind`` is monotonic in the enqueue
        time, so the latest one tells), each joins its key at once; the hot path of
        reading keyed messages."""
        if not entries:
            return entries
        cursor = entries[0].cursor
        latest = max(e.record.enqueued_ms for e in entries)
        if (
            (self._pending and cursor in self._pending)
            or self._resolving
            or (self._behind(cursor, latest))
        ):
            return self.admit(entries)
        extent, held, keys, lines = cursor.extent.id, self.held, self._keys, self._lines
        made = []
        for entry in entries:
            key = entry.record.key
            if key is None:
                made.append(entry)
                continue
            where = (extent, entry.key)
            holder = held.get(key)
            if holder is None:
                held[key] = where
                keys[where] = key
                made.append(entry)
            elif holder == where:
                made.append(entry)
            else:
                line = lines.get(key)
                if line is None:
                    lines[key] = deque((entry,))
                else:
                    line.append(entry)
        return made

    def let(self, entry: Entry) -> bool:
        """Whether a keyed message may be made ready now (else it waits in its line)."""
        record = entry.record
        key = record.key
        assert key is not None
        cursor = entry.cursor
        where = (cursor.extent.id, entry.key)
        holder = self.held.get(key)
        if holder == where:
            return True  # delivered again
        if (
            (self._pending and cursor in self._pending)
            or self._resolving
            or self._behind(cursor, record.enqueued_ms)
        ):
            self._pending.setdefault(cursor, deque()).append(entry)
            self.on_pending()
            return False
        return self._join(key, where, entry, holder)

    def _join(self, key: str, where: Where, entry: Entry, holder: Where | None) -> bool:
        if holder == where:
            return True
        if holder is None:
            self.held[key] = where
            self._keys[where] = key
            return True
        line = self._lines.get(key)
        if line is None:
            self._lines[key] = deque((entry,))
        else:
            line.append(entry)
        return False

    def done(self, entries: Iterable[Entry]) -> None:
        """These messages are settled for good (acked, dead-lettered, expired): their
        keys go to the next message of each line."""
        keys, lines, held = self._keys, self._lines, self.held
        nexts = []
        for entry in entries:  # _pass, inlined: the hot path of acking keyed messages
            key = keys.pop((entry.cursor.extent.id, entry.key), None)
            if key is None:
                continue
            line = lines.get(key)
            if not line:
                del held[key]
                continue
            nxt = line.popleft()
            if not line:
                del lines[key]
            where = held[key] = (nxt.cursor.extent.id, nxt.key)
            keys[where] = key
            nexts.append(nxt)
        if nexts:
            self._ready(nexts)

    def done_at(self, extent: str, storage_key: bytes) -> None:
        """``done`` of a message known by where it is stored (its body is not here)."""
        nxt = self._pass(extent, storage_key)
        if nxt is not None:
            self._ready([nxt])

    def _pass(self, extent: str, storage_key: bytes) -> Entry | None:
        key = self._keys.pop((extent, storage_key), None)
        if key is None:
            return None
        line = self._lines.get(key)
        if not line:
            del self.held[key]
            return None
        nxt = line.popleft()
        if not line:
            del self._lines[key]
        where = (nxt.cursor.id, nxt.key)
        self.held[key] = where
        self._keys[where] = key
        return nxt

    def drop_cursor(self, cursor: ExtentCursor) -> None:
        """Its extent is no longer held here: forget its holders and waiting messages
        (the new holder of the extent reads them again); a key whose holder was of it
        passes to its next waiting message of another extent."""
        for key in [k for k, line in self._lines.items() if any(e.cursor is cursor for e in line)]:
            kept = deque(e for e in self._lines[key] if e.cursor is not cursor)
            if kept:
                self._lines[key] = kept
            else:
                del self._lines[key]
        self._pending.pop(cursor, None)
        for where in [w for w in self._keys if w[0] == cursor.id]:
            self.done_at(*where)
        self.read()  # nothing waits for it any more

    # across extents
    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def waiting_besides(self, cursor: ExtentCursor) -> int:
        """How many messages of extents other than ``cursor``'s wait for other extents'
        reads (the read window leaves them out of that extent's reader's room)."""
        return sum(len(q) for c, q in self._pending.items() if c is not cursor)

    @property
    def waiting_in(self) -> Collection[ExtentCursor]:
        """The cursors with messages waiting for other extents' reads."""
        return self._pending.keys()

    def _behind(self, cursor: ExtentCursor, enqueued_ms: int) -> bool:
        """Whether another extent may still hold an earlier message of any key: one not
        read past ``enqueued_ms`` (those whose readers wait are probed), or one with an
        earlier keyed message pending (its extent was read past, and the cursor's
        ``seen_ms`` is moved only once what it read is admitted)."""
        if enqueued_ms >= self.known_ms() or not self.whole():  # an extent made since is
            return True  # not known here yet; or other hosts hold extents of the group
        for other, pending in self._pending.items():  # (one stamped in the same ms was
            # published at about the same time, not before: else the two would wait on
            # each other)
            if other is not cursor and pending[0].record.enqueued_ms < enqueued_ms:
                return True
        cursors = self._cursors
        if len(cursors) == 1 and cursor.id in cursors:
            return False
        behind = False
        for other in cursors.values():
            # strictly past: a record stamped in the same ms may come before it
            if other is cursor or other.seen_ms > enqueued_ms or not _may_hold(other):
                continue
            if other.extent.created_at * 1000 > enqueued_ms + CREATED_SLACK_MS:
                continue
            behind = True
            if (other.tailing or other.in_read) and other.id not in self._probing:
                self._probe(other)
        return behind

    def read(self) -> None:
        """An extent was read further (or read to its end, or dropped): pending
        messages whose every other extent is read as far join their keys' lines."""
        if self._resolving:
            return
        nexts: list[Entry] = []
        moved = True
        while moved:  # one extent's release may let another's earlier-blocked ones go
            moved = False
            for cursor in list(self._pending):
                pending = self._pending[cursor]
                while pending and not self._behind(cursor, pending[0].record.enqueued_ms):
                    entry = pending.popleft()
                    moved = True
                    key = entry.record.key
                    if key is None or self._join(
                        key, (cursor.id, entry.key), entry, self.held.get(key)
                    ):
                        nexts.append(entry)
                if not pending:
                    del self._pending[cursor]
        if nexts:
            self._ready(nexts)

    def _probe(self, cursor: ExtentCursor) -> None:
        if self._stores is None:
            return
        task = asyncio.create_task(self._probe_once(cursor, self._stores()))
        self._probing[cursor.id] = task

        def finished(_: object) -> None:
            if self._probing.get(cursor.id) is task:
                del self._probing[cursor.id]

        task.add_done_callback(finished)

    async def _probe_once(self, cursor: ExtentCursor, stores: StoreDirectory) -> None:
        """One read after the reader's position: nothing there moves ``seen_ms`` to when
        it was asked; something there is the reader's to bring (it moves it then)."""
        for store_id in cursor.extent.stores:
            asked, at = time.time() * 1000, cursor.read_key
            try:
                batch = await stores.get(store_id).read(cursor.id, cursor.read_key, 1)
            except CheramiError as err:
                log.debug("probe of extent %s on %s failed: %s", cursor.id, store_id, err)
                continue
            if not batch.keys and (cursor.tailing or cursor.in_read) and cursor.read_key == at:
                cursor.seen_ms = max(cursor.seen_ms, asked)
                del self._probing[cursor.id]  # done: what still waits on it probes anew
                self.read()
            return
        await asyncio.sleep(PROBE_RETRY)  # every replica failed: the next wait probes again

    # after a failover
    def resolve(self, rows: list[Parked]) -> None:
        """Parked rows loaded here: claim each one's key for it before any keyed message
        of the group is made ready."""
        if not rows or self._stores is None:
            return
        task = asyncio.create_task(self._resolve(rows, self._stores()))
        self._resolving.add(task)

        def finished(_: object) -> None:
            self._resolving.discard(task)
            self.read()

        task.add_done_callback(finished)

    async def _resolve(self, rows: list[Parked], stores: StoreDirectory) -> None:
        slots = asyncio.Semaphore(RESOLVE_AT_ONCE)
        found: list[tuple[int, str, Parked]] = []

        async def one(row: Parked) -> None:
            cursor = self._cursors.get(row.extent)
            for attempt in range(RESOLVE_TRIES):
                if cursor is None or row.state == GONE:
                    return
                try:
                    async with slots:
                        record = await read_one(stores, cursor.extent, row.key)
                except CheramiError as err:
                    log.warning("parked message of extent %s not read (try %d): %s",
                                row.extent, attempt + 1, err)  # fmt: skip
                    await asyncio.sleep(PROBE_RETRY * (attempt + 1))
                    continue
                if record is not None and record.key is not None:
                    found.append((record.enqueued_ms, record.key, row))
                return

        await asyncio.gather(*map(one, rows))
        for _, key, row in sorted(found, key=lambda f: (f[0], f[2].extent, f[2].key)):
            where = (row.extent, row.key)
            if row.state != GONE and key not in self.held:  # else: settled meanwhile
                self.held[key] = where
                self._keys[where] = key

    def stop(self) -> list[asyncio.Task[None]]:
        tasks = [*self._probing.values(), *self._resolving]
        for task in tasks:
            task.cancel()
        return tasks

    def waiting(self) -> int:
        return sum(map(len, self._lines.values())) + sum(map(len, self._pending.values()))

    def top(self, n: int = TOP_KEYS) -> list[tuple[str, int]]:
        """The ``n`` keys with the most messages here not settled (the holder and its
        line), most first."""
        counts = {k: 1 + len(line) for k, line in self._lines.items()}
        for k in self.held:
            counts.setdefault(k, 1)
        for pending in self._pending.values():
            for entry in pending:
                key = entry.record.key
                if key is not None:  # (an unkeyed one waits behind one, admit)
                    counts[key] = counts.get(key, 0) + 1
        return heapq.nlargest(n, counts.items(), key=lambda kv: kv[1])


def _may_hold(cursor: ExtentCursor) -> bool:
    """Whether an extent may still bring keyed messages that come before others: a plain
    extent being read (not a timer extent: a delayed message joins its key when due; not
    a merged DLQ range: its messages were delivered long before)."""
    return not cursor.read_done and cursor.extent.kind != TIMER and cursor.limit is None
