"""A consumer group's read window: what its extent readers read and it has not
delivered yet (the ready queue), and the room left in its read-ahead. The extent
readers talk to it through extentreader.ReadTarget."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from cherami.errors import CheramiError
from cherami.metadata.models import Group, Queue
from cherami.roles.outputhost.entry import DELIVERY, ENQUEUED, KEY, Entry, Run
from cherami.roles.outputhost.flag import Flag
from cherami.wire.keys import seq_of
from cherami.wire.store import TIMER

if TYPE_CHECKING:
    from cherami.roles.outputhost.extentreader import ExtentCursor
    from cherami.roles.outputhost.keygate import KeyGate
    from cherami.roles.outputhost.redelivery import Redeliveries

log = logging.getLogger("cherami.outputhost.readwindow")

# the cancelled sequence numbers of a timer extent from lo to hi, of messages due by
# due_ms: (extent, lo, hi, due_ms)
CancelledOf = Callable[[str, int, int, int], Awaitable[set[int]]]
RETRY_CANCELLED = 1.0  # seconds before the cancellations are asked again after a failure


class ReadWindow:
    """``cursors`` are the group's extent cursors (whose ack windows make the read-ahead
    used); ``parked`` its redelivery rows (messages read again that have a row are
    delivered as parked ones); ``gate`` its ordering keys (a keyed message waits there
    while an earlier one of its key is not settled)."""

    def __init__(
        self,
        key: str,
        queue: Queue,
        group: Group,
        cursors: dict[str, ExtentCursor],
        parked: Redeliveries,
        gate: KeyGate,
        read_ahead: int,
    ) -> None:
        """``read_ahead``: messages read and not acked yet at most (timing.read_ahead)."""
        self.key = key
        self.read_ahead = read_ahead
        self.queue = queue
        self.group = group
        self._cursors = cursors
        self._parked = parked
        self._gate = gate
        self.ready: deque[Entry | Run] = deque()
        self.readable = Flag()  # set while ready is not empty
        self._room = Flag()
        self._room.set()
        self.stopped = False
        self.on_ready: Callable[[], None] = lambda: None
        self.cancelled_of: CancelledOf | None = None  # cancelled delayed messages
        self.cancelled = 0  # delayed messages acked past unseen, cancelled

    @property
    def delay_ms(self) -> int:
        return int(self.group.config.delay_seconds * 1000)

    def stop(self) -> None:
        self.stopped = True
        self._room.set()  # a reader waiting for room sees the stop

    # room
    def outstanding(self) -> int:
        """Messages read and not acked, over the group's extents."""
        return sum(c.ack.window() for c in self._cursors.values())

    def full(self) -> bool:
        return self.outstanding() >= self.read_ahead

    def freed(self) -> None:
        """Messages left the window (acked, expired, dead-lettered): readers go on."""
        self._room.set()

    async def wait_for_room(self, cursor: ExtentCursor) -> int:
        """Room for ``cursor``'s reader. Messages of other extents that wait (pending) for
        extents to be read further do not count: they may wait for this one, and nothing
        else frees room while they wait (keygate.py: a key moved to a successor extent
        filled the window, and the sealed extent's reader found no room, for good)."""
        while not self.stopped:
            room = self.read_ahead - self.outstanding()
            if room <= 0 and self._gate.pending:
                room += self._gate.waiting_besides(cursor)
            if room > 0:
                return room
            self._room.clear()
            await self._room.wait()
        raise asyncio.CancelledError  # the group stopped

    # ready
    async def admit(self, run: Run) -> None:
        """Messages read from an extent, in order: skip those from before the group's
        start or past retention, hold the rest until due, then make them ready (as the
        run they were read in when all of them are ready now, else one by one)."""
        now_ms = time.time() * 1000
        retention_ms = self.queue.config.retention_seconds * 1000
        start_ms, delay_ms, ready = self.group.start_ms, self.delay_ms, self.ready
        records = run.records
        parked = self._parked
        gone = await self._cancelled(run)
        if (
            not gone
            and not parked.skip
            and min(map(ENQUEUED, records)) >= max(start_ms, now_ms - retention_ms)
            and max(map(DELIVERY, records)) + delay_ms <= now_ms
        ):  # all of them ready now (checked in C)
            gate = self._gate
            if any(map(KEY, records)) or (gate.pending and run.cursor in gate.waiting_in):
                # keyed ones go through the gate, all at once; unkeyed ones too where a
                # keyed one of their extent waits (keygate.py, admit)
                ready.extend(self._gate.admit_read(run.entries()))
                if gate.pending:  # the other readers' room (wait_for_room)
                    self._room.set()
            else:
                ready.append(run)
            if ready:
                self.signal()
            return
        entries = run.entries()
        if parked.skip:  # rows loaded above the ack level: delivered as parked
            entries = parked.pass_over(entries)
        for entry in entries:
            record = entry.record
            if gone and entry.key in gone:  # cancelled before it was due: never delivered
                entry.cursor.ack.ack(entry.ordinal)
                self.cancelled += 1
                continue
            if record.enqueued_ms < start_ms or now_ms > record.enqueued_ms + retention_ms:
                entry.cursor.ack.ack(entry.ordinal)
                continue
            visible_at = record.delivery_ms + delay_ms
            if visible_at > now_ms:
                if ready:
                    self.signal()
                await asyncio.sleep((visible_at - now_ms) / 1000)
                now_ms = time.time() * 1000
            if record.key is not None and not self._gate.let(entry):
                continue  # waits behind an earlier message of its key
            if record.key is None and self._gate.pending and self._gate.holds_back(entry):
                continue  # waits behind a keyed one of its extent (keygate.py, admit)
            ready.append(entry)
        if self._gate.pending:
            self._room.set()
        if ready:
            self.signal()

    def read_further(self) -> None:
        if self._gate.pending:
            self._gate.read()

    async def _cancelled(self, run: Run) -> set[bytes]:
        """The keys of a timer extent's run (due now) whose messages were cancelled; asked
        again until the metadata store answers (a cancel is never lost to an outage)."""
        if self.cancelled_of is None or run.cursor.extent.kind != TIMER:
            return set()
        keys = run.keys[run.pos :]
        seqs = list(map(seq_of, keys))
        while not self.stopped:
            try:
                due = max(map(DELIVERY, run.records[run.pos :]))
                found = await self.cancelled_of(run.cursor.id, min(seqs), max(seqs), due)
            except CheramiError as err:
                log.warning("group %s: cancelled messages of %s not read: %s",
                            self.key, run.cursor.id, err)  # fmt: skip
                await asyncio.sleep(RETRY_CANCELLED)
                continue
            return {k for k, n in zip(keys, seqs, strict=True) if n in found} if found else set()
        raise asyncio.CancelledError  # the group stopped

    def put_first(self, entries: list[Entry], admitted: bool = False) -> None:
        """Entries delivered again (parked, now due; ``admitted``: the next of a key,
        from the gate) go ahead of what was read."""
        self.ready.extendleft(reversed(entries if admitted else self._gate.admit(entries)))
        self.signal()

    def signal(self) -> None:
        """Something was made ready. Not when it all went to wait at the gate (parked
        keyed messages due while their keys are held, or while a failover's parked rows
        are resolved): ``readable`` set over an empty ready queue had every stream's
        pump loop on it without ever yielding, and the process answered nothing more."""
        if not self.ready:
            return
        if not self.readable.is_set():
            self.readable.set()
        self.on_ready()

    def taken(self) -> None:
        """Deliveries were taken from the head: note when nothing is ready any more."""
        if not self.ready:
            self.readable.clear()

    def drop(self, cursors: Iterable[ExtentCursor]) -> None:
        """Forget what is ready of these cursors' extents."""
        gone = set(cursors)
        kept = [e for e in self.ready if e.cursor not in gone]
        self.ready.clear()
        self.ready.extend(kept)
        if not kept:
            self.readable.clear()
        self._room.set()
