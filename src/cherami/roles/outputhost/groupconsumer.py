"""One consumer group on the output host: its extent cursors and readers, and the
parts it is made of: the read window (readwindow.py), the deliveries in flight
(inflight.py), redelivery after a visibility timeout or a nack (parked durably,
redelivery.py) and poison messages on their way to the DLQ (deadletterqueue.py). The
ack levels it keeps in its cursors are written by the output host's committer
(committer.py). Whether it may act for an extent (fencing) it asks ``acts``."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from cherami.context import DEFAULT, ProcessContext
from cherami.errors import CheramiError
from cherami.metadata.models import STREAM, AckLevel, Extent, Group, Queue, Redelivery
from cherami.roles.outputhost.deadletterqueue import DeadLetters
from cherami.roles.outputhost.entry import Delivered, Entry, Run
from cherami.roles.outputhost.extentreader import ExtentCursor, read_extent
from cherami.roles.outputhost.flag import Flag
from cherami.roles.outputhost.inflight import InFlight
from cherami.roles.outputhost.keygate import KeyGate
from cherami.roles.outputhost.readwindow import ReadWindow
from cherami.roles.outputhost.redelivery import GONE, OUT, Parked, Redeliveries, read_one
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.roles.outputhost.ticker import MAX_TICK, Ticker
from cherami.telemetry import END_TO_END_BUCKETS, Histogram
from cherami.wire.keys import seq_of
from cherami.wire.records import message_id

log = logging.getLogger("cherami.outputhost.groupconsumer")

PIN_CHECK = 0.5  # how often a full read window looks for deliveries held at its head
RETRY_READ_MS = 1000  # a parked body that could not be read by key is tried again then

# moves a group's poison messages to its dead-letter queue (deadletterqueue.py)
DeadLetter = Callable[[str, list[Entry]], Awaitable[None]]
# whether this host may deliver and settle the messages of an extent now (fencing)
Acts = Callable[[str], bool]


class GroupConsumer:
    def __init__(
        self,
        queue: Queue,
        group: Group,
        reads: SharedReads,
        dead_letter: DeadLetter,
        delivery_numbers: itertools.count[int],
        acts: Acts | None = None,
        ctx: ProcessContext = DEFAULT,
    ) -> None:
        """``acts`` tells, for an extent id, whether this host may act for it now (its
        lease, ownership.py); None: it acts for every extent (one process serves all).
        ``ctx``: the process's read-ahead, and its clock (monotonic seconds), which
        times the visibility deadlines: tests advance it instead of sleeping."""
        self.clock = ctx.clock
        self.key = f"{group.queue}/{group.name}"
        self.scope = self.key.encode()
        self.reads = reads
        self._acts = acts
        self.cursors: dict[str, ExtentCursor] = {}
        self.ticker = Ticker(self._has_timers, self._next_timer_in, self._expire, self.clock,
                             lambda: self.window.stopped)  # fmt: skip
        self._wake = self.ticker.wake  # a new timer: the ticker looks again
        self.parked = Redeliveries(group.queue, group.name, self._covered, self._redeliver)
        self.parked.on_pending = self._unwritten
        self.parked.on_waiting = self._wake
        self.keys = KeyGate(
            lambda e: self.window.put_first(e, True), self.cursors, lambda: reads.stores
        )
        self.window = ReadWindow(
            self.key, queue, group, self.cursors, self.parked, self.keys, ctx.timing.read_ahead
        )
        self.flight = InFlight(delivery_numbers, self.parked.forget, self.window.freed, self.keys)
        self.dead = DeadLetters(
            self.key, lambda entries: dead_letter(self.group.dlq, entries), self._dead_lettered
        )
        # called when an ack level moves or a parked row changes: the output host writes
        # this group at its next flush (and only the groups it was told of)
        self.on_unwritten: Callable[[], None] = lambda: None
        self._reading: set[asyncio.Task[None]] = set()  # parked bodies read by key
        self._held: set[int] = set()  # in flight at a full window's head at the last check
        self._pin_at = 0.0
        # a node unloads a group left alone (idlegroups.py): receives waiting on it now,
        # and when it was last asked for (the clock's seconds)
        self.users = 0
        self.used_at = self.clock()
        self.delivered = self.acked = self.redelivered = self.dead_lettered = 0
        self.nacked = 0
        self.end_to_end = Histogram(END_TO_END_BUCKETS)  # publish to ack, seconds

    # configuration
    @property
    def queue(self) -> Queue:
        return self.window.queue

    @property
    def group(self) -> Group:
        return self.window.group

    def configure(self, queue: Queue | None = None, group: Group | None = None) -> None:
        """The queue's or the group's configuration changed."""
        if queue is not None:
            self.window.queue = queue
        if group is not None:
            self.window.group = group

    @property
    def delay_ms(self) -> int:
        return self.window.delay_ms

    @property
    def visibility(self) -> float:
        return self.group.config.visibility_timeout_seconds

    @property
    def ready(self) -> deque[Entry | Run]:
        return self.window.ready

    @property
    def readable(self) -> Flag:
        return self.window.readable

    @property
    def stopped(self) -> bool:
        return self.window.stopped

    @property
    def reading(self) -> bool:
        """Whether bodies of due parked messages are being read again."""
        return bool(self._reading)

    @property
    def in_flight(self) -> int:
        return len(self.flight)

    def start(self) -> None:
        self.ticker.start()

    def halt(self) -> None:
        """Deliver and settle nothing more here (the group is being unloaded)."""
        self.window.stop()

    async def stop(self) -> None:
        self.window.stop()
        self.flight.activity.gone(*self.cursors.values())
        tasks = [c.task for c in self.cursors.values()] + [self.ticker.task, self.dead.task]
        live = [t for t in [*tasks, *self._reading, *self.keys.stop()] if t is not None]
        for task in live:
            task.cancel()
        if live:
            await asyncio.wait(live, timeout=5)
        for cursor in self.cursors.values():  # load reports keep it a minute (loadmeter):
            cursor.task, cursor.ack.on_dirty = None, None  # not the group with it

    # fencing: asked of ownership, never stamped in
    def not_acting(self) -> set[str] | None:
        """The extents this host may not act for now (None: it acts for every one)."""
        acts = self._acts
        if acts is None:
            return None
        return {i for i in self.cursors if not acts(i)} or None

    def acts_at_all(self) -> bool:
        """Whether this host may deliver anything of the group now."""
        if self.stopped:
            return False
        acts = self._acts
        return acts is None or any(map(acts, self.cursors))

    def may_settle(self, numbers: Iterable[int]) -> bool:
        """Whether every delivery named is of an extent that acts (one no longer in
        flight could be of any extent: it is stale only when every extent acts)."""
        if self.stopped:
            return False
        not_acting = self.not_acting()
        if not not_acting:
            return True
        cursors = map(self.flight.cursor_of, numbers)
        return all(c is not None and c.id not in not_acting for c in cursors)

    # extents
    def sync_extents(self, extents: list[Extent], levels: dict[str, AckLevel]) -> None:
        """Follow the queue's extents (and DLQ ranges merged into this group).

        Stream-mode groups are read by their clients straight from the store hosts
        (the Spark source); the output host keeps no cursors for them."""
        if self.group.config.type == STREAM:
            return
        current = {e.id for e in extents}
        for gone in [c for i, c in self.cursors.items() if i not in current]:
            if gone.read_done and not gone.ack.window():  # deleted by retention, all acked
                del self.cursors[gone.id]
                self.flight.activity.gone(gone)
        for extent in extents:
            level = levels.get(extent.id) or AckLevel(
                queue=self.group.queue, group=self.group.name, extent=extent.id
            )
            cursor = self.cursors.get(extent.id)
            if cursor is None:
                cursor = ExtentCursor(extent, level)
                cursor.ack.on_dirty = self._unwritten
                self.cursors[extent.id] = cursor
            else:
                cursor.follow(extent, level.limit)
            if self._waits_for_predecessor(cursor):
                continue
            if not cursor.read_done and (cursor.task is None or cursor.task.done()):
                cursor.task = asyncio.create_task(self._read(cursor))

    def _waits_for_predecessor(self, cursor: ExtentCursor) -> bool:
        """CP queues keep order across seals: an extent is read only after the extent it
        succeeds has been read to its end."""
        before = cursor.extent.predecessor
        if self.queue.config.type != "cp" or before is None:
            return False
        previous = self.cursors.get(before)
        return previous is not None and not previous.read_done

    async def _read(self, cursor: ExtentCursor) -> None:
        try:
            await read_extent(self.window, cursor, self.reads)
            for successor in self.cursors.values():  # CP: its successor may start now
                if (
                    cursor.read_done
                    and successor.extent.predecessor == cursor.id
                    and successor.task is None
                ):
                    successor.task = asyncio.create_task(self._read(successor))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("group %s: reader of extent %s failed", self.key, cursor.id)

    def drop_extent(self, extent_id: str) -> None:
        """This host no longer holds the extent: its reader stops, and its ready and
        in-flight messages and parked rows are forgotten here (their deliveries' handles
        and receipts go stale); the new holder delivers them from the persisted state."""
        if (cursor := self.cursors.pop(extent_id, None)) is None:
            return
        self.flight.activity.gone(cursor)
        if cursor.task is not None:
            cursor.task.cancel()
        self.window.drop([cursor])
        self.keys.drop_cursor(cursor)
        self.flight.drop_cursor(cursor)
        self.dead.drop_cursor(cursor)
        self.parked.drop_extent(extent_id)

    # ack levels (written by the output host's committer, committer.py)
    def _unwritten(self) -> None:
        self.on_unwritten()

    def unwritten(self) -> set[str]:
        """Extents with an ack level or parked rows to write."""
        extents = {c.id for c in self.cursors.values() if c.ack.dirty}
        return extents | self.parked.pending_extents()

    def dirty_levels(self, extents: set[str] | None = None) -> list[AckLevel]:
        """The ack levels to write (of ``extents`` only, unless None), now marked
        written; ``unwritten_again`` undoes that when the write fails."""
        rows = []
        for cursor in self.cursors.values():
            if cursor.ack.dirty and (extents is None or cursor.id in extents):
                cursor.ack.dirty = False
                rows.append(cursor.level_row(self.group.queue, self.group.name))
        return rows

    def unwritten_again(self, extents: set[str] | None = None) -> None:
        for cursor in self.cursors.values():
            if extents is None or cursor.id in extents:
                cursor.ack.dirty = True

    # delivery
    def outstanding(self) -> int:
        return self.window.outstanding()

    def take(
        self, limit: int, visibility: float | None, owner: Any = None, max_bytes: int = 0
    ) -> list[Entry]:
        """Deliver up to ``limit`` ready messages (and, with ``max_bytes``, no more bodies
        than fit in that many bytes, but always at least one)."""
        taken, _ = self._take(limit, visibility, owner, max_bytes, False)
        return taken  # type: ignore[return-value]  # only entries without runs

    def take_runs(
        self, limit: int, owner: Any, max_bytes: int
    ) -> tuple[list[Entry | Delivered], int]:
        """``take`` for a stream: messages read in a row and never delivered before are
        delivered as runs (no entry per message). Returns the deliveries and how many
        messages they hold."""
        return self._take(limit, None, owner, max_bytes, True)

    def _take(
        self, limit: int, visibility: float | None, owner: Any, max_bytes: int, runs: bool
    ) -> tuple[list[Entry | Delivered], int]:
        window = self.window
        if not window.ready or self.stopped:
            return [], 0
        deadline = self.clock() + (visibility if visibility is not None else self.visibility)
        expired_before = time.time() * 1000 - self.queue.config.retention_seconds * 1000
        taken, count, redelivered = self.flight.take(
            window.ready, limit, deadline, owner, max_bytes, runs, self.not_acting(),
            expired_before,
        )  # fmt: skip
        window.taken()
        if taken:
            self._wake()
            self.delivered += count
            self.redelivered += redelivered
        if redelivered:  # handed out now: their rows count these deliveries
            self.parked.delivered(taken)
        return taken, count

    def ack(self, numbers: list[int], owner: Any = None) -> list[int]:
        """Ack current deliveries; returns the numbers that were stale."""
        stale, acked, enqueued = self.flight.ack(numbers, owner)
        if not acked:
            return stale
        now_ms = time.time() * 1000
        self.end_to_end.observe_counted(  # ages per distinct enqueue time, counted in C
            (max(0.0, (now_ms - ms) / 1000), n) for ms, n in enqueued.items()
        )
        self.acked += acked
        self.window.freed()
        return stale

    def nack(self, numbers: list[int], delay: float, owner: Any = None) -> list[int]:
        settled, stale = self.flight.settle(numbers, owner)
        self.nacked += len(settled)
        self._park(settled, delay)
        return stale

    def extend(self, numbers: list[int], visibility: float, owner: Any = None) -> list[int]:
        stale = self.flight.extend(numbers, self.clock() + visibility, owner)
        if len(stale) < len(numbers):
            self._wake()
        return stale

    def release_owner(self, owner: Any) -> None:
        """A stream closed: what it held is parked, due at once."""
        self._park(self.flight.release(owner), 0.0)

    # parked messages (redelivery.py)
    def _park(self, entries: list[Entry], delay: float) -> None:
        """Deliveries that ended without an ack: each gets its row (the deliveries so
        far, due after ``delay``; at once when it has had max_delivery_count)."""
        now_ms = int(time.time() * 1000)
        due_ms = now_ms + int(delay * 1000)
        limit = self.group.config.max_delivery_count
        for entry in entries:
            self.parked.park(entry, now_ms if entry.count >= limit else due_ms)

    def _covered(self, entry: Entry) -> None:
        """A row holds the entry now: ack it in its cursor so the window moves on."""
        if entry.cursor.ack.ack(entry.ordinal):
            self.window.freed()

    def _redeliver(self, entries: list[Entry]) -> None:
        """Parked entries now due: deliver them first."""
        self.window.put_first(entries)

    def _release_due(self, now_ms: int) -> None:
        due = self.parked.due(now_ms)
        unread = [p for p in due if p.entry is None]
        self.parked.release([p for p in due if p.entry and self._requeue(p, p.entry, now_ms)])
        if unread:
            task = asyncio.create_task(self._read_parked(unread))
            self._reading.add(task)
            task.add_done_callback(self._reading.discard)

    def _requeue(self, parked: Parked, entry: Entry, now_ms: int) -> bool:
        """A due parked message: to the DLQ at the delivery limit, forgotten past
        retention or its TTL; else True (delivered again, ``Redeliveries.release``)."""
        retention_ms = self.queue.config.retention_seconds * 1000
        if now_ms > entry.record.enqueued_ms + retention_ms or self.flight.outlived(entry):
            self._forget(parked)
        elif parked.count >= self.group.config.max_delivery_count:
            parked.state = OUT
            self.dead.add(entry)
        else:
            return True
        return False

    def _forget(self, parked: Parked) -> None:
        """A parked message gone for good (expired, deleted): its key moves on."""
        self.parked.forget(parked)
        self.keys.done_at(parked.extent, parked.key)

    def _dead_lettered(self, entries: list[Entry]) -> None:
        """Messages now in the DLQ: acked here."""
        for entry in entries:
            entry.cursor.ack.ack(entry.ordinal)
            if entry.row is not None:
                self.parked.forget(entry.row)
        self.keys.done(entries)
        self.dead_lettered += len(entries)
        self.window.freed()

    async def _read_parked(self, unread: list[Parked]) -> None:
        """Bodies of due parked messages not kept in memory, read again by key."""
        for parked in unread:
            if parked.state == GONE:  # its extent was dropped here meanwhile
                continue
            cursor = self.cursors.get(parked.extent)
            if cursor is None:  # its extent was deleted (retention, or its queue's contents)
                self._forget(parked)
                continue
            try:
                record = await read_one(self.reads.stores, cursor.extent, parked.key)
            except CheramiError as err:
                log.warning("group %s: parked message %s of %s could not be read: %s",
                            self.key, seq_of(parked.key), parked.extent, err)  # fmt: skip
                self.parked.retry(parked, int(time.time() * 1000) + RETRY_READ_MS)
                continue
            if record is None:  # deleted by retention
                self._forget(parked)
                continue
            msg_id = record.orig_id or message_id(parked.extent, seq_of(parked.key))
            entry = Entry(cursor, -1, msg_id, record, parked.key)  # -1: the level is past it
            entry.count = parked.count
            entry.row = parked
            parked.entry = entry
            if self._requeue(parked, entry, int(time.time() * 1000)):
                self.parked.release([parked])

    def load_parked(
        self, rows: list[Redelivery], extents: set[str], levels: dict[str, AckLevel]
    ) -> None:
        """The redelivery rows of extents taken here, before their reads start."""
        self.parked.load(
            rows, extents, {e: lv.level for e, lv in levels.items()},
            self.group.config.max_delivery_count, int(time.time() * 1000),
        )  # fmt: skip
        self.keys.resolve([p for (e, _), p in self.parked.rows.items() if e in extents])
        self._wake()

    def _pin_held(self, now: float) -> None:
        """With the read window full, deliveries in flight at its head since the last
        check (and every delivery made before them) get a row, so the window moves past
        them while they stay in flight."""
        self._pin_at = now + PIN_CHECK
        if not self.window.full():
            self._held.clear()
            return
        heads = {no for c in self.cursors.values() if (no := c.head_number())}
        held, self._held = heads & self._held, heads
        if not held:
            return
        now_ms = int(time.time() * 1000)
        for entry in self.flight.through(max(held)):  # a row each, as for any delivery
            if entry.row is None:
                self.parked.pin(entry, now_ms + int(max(0.0, entry.deadline - now) * 1000))

    # timers
    def _next_timer_in(self, now: float) -> float:
        """Seconds until the first of the group's timers is due (MAX_TICK at most)."""
        first = now + MAX_TICK
        if (deadline := self.flight.next_deadline()) is not None:
            first = min(first, deadline)
        due_ms = self.parked.next_due_ms()
        if due_ms is not None:
            first = min(first, now + (due_ms - time.time() * 1000) / 1000)
        if self.window.full():
            first = min(first, self._pin_at)
        return first - now

    def _has_timers(self) -> bool:
        return bool(self.flight or self.parked.rows or self.dead)

    def _expire(self, now: float) -> None:
        if expired := self.flight.expire(now):
            self._park(expired, 0.0)
        self._release_due(int(time.time() * 1000))
        if now >= self._pin_at:
            self._pin_held(now)

    # stats
    def backlog_above(self, counts: dict[str, int]) -> int:
        """Messages published and not yet acked, given each extent's message count."""
        total = 0
        for extent_id, cursor in self.cursors.items():
            count = counts.get(extent_id, 0)
            if cursor.limit is not None:
                count = min(count, int.from_bytes(cursor.limit, "big"))
            total += max(0, count - cursor.ack.acked - cursor.ack.acked_above_level())
        return total + self.parked.held()

    def oldest_unacked_ms(self) -> int | None:
        oldest = []
        for cursor in self.cursors.values():
            head = cursor.ack.oldest()
            if head is not None and head[1] is not None:
                oldest.append(head[1].record_at(head[0]).enqueued_ms)
        return min(oldest) if oldest else None
