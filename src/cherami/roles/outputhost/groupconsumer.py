"""One consumer group on the output host: what is ready to deliver, what is in flight,
redelivery after the visibility timeout or a nack (parked durably, redelivery.py), and
poison messages to the DLQ."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from itertools import accumulate, compress, count, islice, repeat
from operator import attrgetter, ne, sub
from typing import Any

from cherami import timing
from cherami.errors import CheramiError
from cherami.metadata.models import STREAM, AckLevel, Extent, Group, Queue, Redelivery
from cherami.roles.outputhost.entry import BODY, DELIVERY, ENQUEUED, Delivered, Entry, Run
from cherami.roles.outputhost.extentreader import ExtentCursor, read_extent
from cherami.roles.outputhost.redelivery import GONE, OUT, Parked, Redeliveries, read_one
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.telemetry import END_TO_END_BUCKETS, Histogram
from cherami.wire.keys import seq_of
from cherami.wire.records import message_id

log = logging.getLogger("cherami.outputhost.groupconsumer")

READ_AHEAD = timing.DEFAULT.read_ahead  # messages read, not acked, per group (timing.py)
TICK = 0.02  # a group's timers fire at most this often
MAX_TICK = 1.0  # and look at least this often while it has any
PIN_CHECK = 0.5  # how often a full read window looks for deliveries held at its head
RETRY_READ_MS = 1000  # a parked body that could not be read by key is tried again then
MIN_RUN = 16  # fewer messages than this taken at once (a short read, little credit
# left) are delivered as entries: a run each would cost more than it saves

DeadLetter = Callable[["GroupConsumer", list[Entry]], Awaitable[None]]
# runs an iterator to its end in C (numbers handed out to a run, skipped past)
_skip: Callable[[Iterable[int]], None] = deque[int](maxlen=0).extend
RECORD = attrgetter("record")


class GroupConsumer:
    def __init__(
        self,
        queue: Queue,
        group: Group,
        reads: SharedReads,
        dead_letter: DeadLetter,
        delivery_numbers: itertools.count[int],
    ) -> None:
        self.queue = queue
        self.group = group
        self.key = f"{group.queue}/{group.name}"
        self.scope = self.key.encode()
        self.reads = reads
        self._dead_letter = dead_letter
        self._numbers = delivery_numbers
        self.cursors: dict[str, ExtentCursor] = {}
        self.ready: deque[Entry | Run] = deque()
        self.inflight: dict[int, Entry] = {}  # delivered one by one, by delivery number
        self._runs: dict[int, Delivered] = {}  # delivered as runs, by first number
        self._firsts: list[int] = []  # the keys of _runs, in order
        self._timeouts: list[tuple[float, int]] = []
        self._timers_due = asyncio.Event()  # a new timer: the ticker looks again
        self.parked = Redeliveries(group.queue, group.name, self._covered, self._redeliver)
        self.parked.on_pending = self._unwritten
        self.parked.on_waiting = self._timers_due.set
        # called when an ack level moves or a parked row changes: the output host writes
        # this group at its next flush (and only the groups it was told of)
        self.on_unwritten: Callable[[], None] = lambda: None
        self._reading: set[asyncio.Task[None]] = set()  # parked bodies read by key
        self._held: set[int] = set()  # in flight at a full window's head at the last check
        self._pin_at = 0.0
        self._room = asyncio.Event()
        self._room.set()
        self.readable = asyncio.Event()  # set while ready is not empty
        self._dlq_pending: list[Entry] = []
        self._ticker: asyncio.Task[None] | None = None
        self._dlq_task: asyncio.Task[None] | None = None
        self.delivered = self.acked = self.redelivered = self.dead_lettered = 0
        self.nacked = 0
        self.end_to_end = Histogram(END_TO_END_BUCKETS)  # publish to ack, seconds
        self.on_ready: Callable[[], None] = lambda: None
        self.stopped = False
        self.all_acting = True  # every cursor acts (as last stamped by the output host)

    # configuration
    @property
    def delay_ms(self) -> int:
        return int(self.group.config.delay_seconds * 1000)

    @property
    def visibility(self) -> float:
        return self.group.config.visibility_timeout_seconds

    def start(self) -> None:
        self._ticker = asyncio.create_task(self._tick_loop())

    async def stop(self) -> None:
        self.stopped = True
        self._room.set()  # a reader waiting for room sees the stop
        tasks = [c.task for c in self.cursors.values() if c.task] + [self._ticker, self._dlq_task]
        tasks += self._reading
        live = [t for t in tasks if t is not None]
        for task in live:
            task.cancel()
        if live:
            await asyncio.wait(live, timeout=5)

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
                cursor.extent = extent
                if level.limit is not None and level.limit != cursor.limit:
                    cursor.limit = level.limit
                    cursor.read_done = False
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
            await read_extent(self, cursor, self.reads)
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
        cursor = self.cursors.pop(extent_id, None)
        if cursor is None:
            return
        cursor.acting = False
        if cursor.task is not None:
            cursor.task.cancel()
        kept = [e for e in self.ready if e.cursor is not cursor]
        self.ready.clear()
        self.ready.extend(kept)
        if not kept:
            self.readable.clear()
        for no in [no for no, e in self.inflight.items() if e.cursor is cursor]:
            entry = self.inflight.pop(no)
            entry.no = 0
            entry.owner = None
        for run in [d for d in self._runs.values() if d.cursor is cursor]:
            self._forget_run(run)
        self._dlq_pending = [e for e in self._dlq_pending if e.cursor is not cursor]
        self.parked.drop_extent(extent_id)
        self._room.set()

    def may_settle(self, numbers: Iterable[int]) -> bool:
        """Whether every delivery named is of an extent that acts (one no longer in
        flight could be of any extent: it is stale only when every extent acts)."""
        if self.all_acting:
            return True
        for no in numbers:
            cursor = self.cursor_of(no)
            if cursor is None or not cursor.acting:
                return False
        return True

    def cursor_of(self, no: int) -> ExtentCursor | None:
        """The cursor of the current delivery ``no`` (None: not current)."""
        entry = self.inflight.get(no)
        if entry is not None:
            return entry.cursor
        run = self._run_of(no)
        return None if run is None else run.cursor

    def _run_of(self, no: int) -> Delivered | None:
        firsts = self._firsts
        i = bisect_right(firsts, no) - 1
        if i < 0:
            return None
        run = self._runs[firsts[i]]
        return run if no < run.first + run.n else None

    def _forget_run(self, run: Delivered) -> None:
        del self._runs[run.first]
        firsts = self._firsts
        del firsts[bisect_left(firsts, run.first)]

    def _unrun(self, run: Delivered) -> None:
        """A delivered run's unsettled messages become entries in flight."""
        self._forget_run(run)
        inflight = self.inflight
        for entry in run.entries():
            inflight[entry.no] = entry

    def _unrun_where(self, which: Callable[[Delivered], bool]) -> None:
        for run in [d for d in self._runs.values() if which(d)]:
            self._unrun(run)

    def _take_out(self, numbers: Iterable[int]) -> None:
        """The deliveries named that are in runs become entries in flight (a nack or an
        extend settles them one by one; the rest of their runs stay as they are)."""
        if not self._runs:
            return
        inflight = self.inflight
        for no in numbers:
            run = self._run_of(no)
            if run is None:
                continue
            entry = run.take_out(no)
            if entry is not None:
                inflight[no] = entry
                if not run.left:
                    self._forget_run(run)

    @property
    def in_flight(self) -> int:
        return len(self.inflight) + sum(run.left for run in self._runs.values())

    def _unwritten(self) -> None:
        self.on_unwritten()

    def unwritten(self) -> set[str]:
        """Extents with an ack level or parked rows to write."""
        extents = {c.id for c in self.cursors.values() if c.ack.dirty}
        return extents | self.parked.pending_extents()

    def dirty_levels(self, extents: set[str] | None = None) -> list[AckLevel]:
        rows = []
        for cursor in self.cursors.values():
            if cursor.ack.dirty and (extents is None or cursor.id in extents):
                cursor.ack.dirty = False
                rows.append(cursor.level_row(self.group.queue, self.group.name))
        return rows

    # read side
    def outstanding(self) -> int:
        return sum(c.ack.window() for c in self.cursors.values())

    async def wait_for_room(self) -> int:
        while not self.stopped:
            room = timing.current.read_ahead - self.outstanding()
            if room > 0:
                return room
            self._room.clear()
            await self._room.wait()
        raise asyncio.CancelledError  # the group stopped

    async def admit(self, run: Run) -> None:
        """Messages read from an extent, in order: skip those from before the group's
        start or past retention, hold the rest until due, then make them ready (as the
        run they were read in when all of them are ready now, else one by one)."""
        now_ms = time.time() * 1000
        retention_ms = self.queue.config.retention_seconds * 1000
        start_ms, delay_ms, ready = self.group.start_ms, self.delay_ms, self.ready
        records = run.records
        if (
            not self.parked.skip
            and min(map(ENQUEUED, records)) >= max(start_ms, now_ms - retention_ms)
            and max(map(DELIVERY, records)) + delay_ms <= now_ms
        ):
            ready.append(run)
            self._signal_ready()
            return
        entries = run.entries()
        if self.parked.skip:  # rows loaded above the ack level: delivered as parked
            entries = self.parked.pass_over(entries)
        for entry in entries:
            record = entry.record
            if record.enqueued_ms < start_ms or now_ms > record.enqueued_ms + retention_ms:
                entry.cursor.ack.ack(entry.ordinal)
                continue
            visible_at = record.delivery_ms + delay_ms
            if visible_at > now_ms:
                if ready:
                    self._signal_ready()
                await asyncio.sleep((visible_at - now_ms) / 1000)
                now_ms = time.time() * 1000
            ready.append(entry)
        if ready:
            self._signal_ready()

    def _signal_ready(self) -> None:
        if not self.readable.is_set():
            self.readable.set()
        self.on_ready()

    # delivery
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
        ready = self.ready
        if not ready:
            return [], 0
        deadline = time.monotonic() + (visibility if visibility is not None else self.visibility)
        taken: list[Entry | Delivered] = []
        count = 0
        passed: list[Entry | Run] = []  # of extents this host may not act for now
        inflight, numbers, timeouts = self.inflight, self._numbers, self._timeouts
        expired_before = time.time() * 1000 - self.queue.config.retention_seconds * 1000
        all_acting = self.all_acting
        size = 0  # of the bodies taken and the one that did not fit
        last = 0  # the last delivery number given
        # deliveries and bytes per cursor, counted for a run of one cursor at a time
        cursor: Any = None
        run = run_bytes = redelivered = 0
        while ready and count < limit:
            entry = ready.popleft()
            if not all_acting and not entry.cursor.acting:
                passed.append(entry)
                continue
            if isinstance(entry, Run):
                if not runs or not all_acting:
                    ready.extendleft(reversed(entry.entries()))
                    continue
                if min(len(entry), limit - count) < MIN_RUN:  # a few: entries, not a run
                    few = entry.entries(limit - count)
                    if len(entry):
                        ready.appendleft(entry)
                    ready.extendleft(reversed(few))
                    continue
                room = max_bytes - size if max_bytes else None
                fits = self._deliver_run(entry, limit - count, room, count, expired_before)
                if fits is None:  # one of them expired: deliver them one by one
                    ready.extendleft(reversed(entry.entries()))
                    continue
                n, body_bytes = fits
                if not n:  # no room left for the next body
                    ready.appendleft(entry)
                    break
                made = self._hand_out(entry, n, body_bytes, owner, deadline)
                if len(entry):
                    ready.appendleft(entry)
                taken.append(made)
                count += n
                size += body_bytes
                last = made.first + n - 1
                continue
            record = entry.record
            body = len(record.body)
            if max_bytes:
                size += body
                if size > max_bytes and taken:
                    ready.appendleft(entry)
                    break
            if record.enqueued_ms < expired_before:  # never deliver an expired message
                entry.cursor.ack.ack(entry.ordinal)
                if entry.row is not None:
                    self.parked.forget(entry.row)
                self._room.set()
                continue
            no = last = next(numbers)
            entry.no = no
            entry.deadline = deadline
            entry.owner = owner
            inflight[no] = entry
            taken.append(entry)
            count += 1
            if entry.count:
                redelivered += 1
            entry.count += 1
            if entry.cursor is not cursor:
                if cursor is not None:
                    cursor.delivered += run
                    cursor.delivered_bytes += run_bytes
                cursor, run, run_bytes = entry.cursor, 0, 0
            run += 1
            run_bytes += body
        if cursor is not None:
            cursor.delivered += run
            cursor.delivered_bytes += run_bytes
        self.redelivered += redelivered
        if passed:
            ready.extendleft(reversed(passed))
        if not ready:
            self.readable.clear()
        if taken:
            heapq.heappush(timeouts, (deadline, last))  # one timer a batch; see _expire
            self._timers_due.set()
            self.delivered += count
        return taken, count

    def _hand_out(
        self, run: Run, n: int, body_bytes: int, owner: Any, deadline: float
    ) -> Delivered:
        """The next ``n`` messages of a ready run, delivered as one run: consecutive
        numbers, tracked by their cursor as that run."""
        numbers = self._numbers
        first = next(numbers)
        if n > 1:
            _skip(islice(numbers, n - 1))
        made = Delivered(run, n, first, owner, deadline)
        self._runs[first] = made
        self._firsts.append(first)
        cursor = made.cursor
        cursor.ack.hold(made.ordinal, [made] * n)
        cursor.delivered += n
        cursor.delivered_bytes += body_bytes
        return made

    @staticmethod
    def _deliver_run(
        run: Run, limit: int, room: int | None, count: int, expired_before: float
    ) -> tuple[int, int] | None:
        """How many of a ready run's next messages to deliver now (at most ``limit``,
        bodies in ``room`` bytes unless ``room`` is None, at least one when nothing was
        taken yet), and their body bytes; None when one of them has expired."""
        pos = run.pos
        records = run.records[pos : pos + limit]
        if min(map(ENQUEUED, records)) < expired_before:
            return None
        sizes = list(accumulate(map(len, map(BODY, records))))
        n = len(records)
        if room is not None:
            n = bisect_right(sizes, room)
            if not n and not count:
                n = 1
        return n, (sizes[n - 1] if n else 0)

    def _settle(self, numbers: list[int], owner: Any) -> tuple[list[Entry], list[int]]:
        settled: list[Entry] = []
        stale: list[int] = []
        inflight = self.inflight
        for no in numbers:
            entry = inflight.get(no)
            if entry is None or (owner is not None and entry.owner is not owner):
                stale.append(no)
                continue
            del inflight[no]
            entry.no = 0
            entry.owner = None
            settled.append(entry)
        return settled, stale

    def ack(self, numbers: list[int], owner: Any = None) -> list[int]:
        """Ack current deliveries; returns the numbers that were stale. (The hot path
        of consuming: runs of numbers delivered as a run settle as ranges; the rest one
        pass, each cursor's ordinals acked together.)"""
        enqueued: Counter[int] = Counter()  # ms; a batch's messages mostly share a few
        acked = 0
        if self._runs:
            numbers, acked = self._ack_runs(numbers, owner, enqueued)
        settled, stale = self._settle(numbers, owner)
        if settled:
            enqueued.update(map(ENQUEUED, map(RECORD, settled)))
            cursor: Any = None
            ordinals: list[int] = []
            for entry in settled:
                if entry.cursor is not cursor:
                    if ordinals:
                        cursor.ack.ack_many(ordinals)
                    cursor, ordinals = entry.cursor, []
                ordinals.append(entry.ordinal)
                if entry.row is not None:
                    self.parked.forget(entry.row)
            cursor.ack.ack_many(ordinals)
            acked += len(settled)
        if not acked:
            return stale
        now_ms = time.time() * 1000
        self.end_to_end.observe_counted(  # ages per distinct enqueue time, counted in C
            (max(0.0, (now_ms - ms) / 1000), n) for ms, n in enqueued.items()
        )
        self.acked += acked
        self._room.set()
        return stale

    def _ack_runs(
        self, numbers: list[int], owner: Any, enqueued: Counter[int]
    ) -> tuple[list[int], int]:
        """Acks of deliveries made as runs: a stretch of consecutive numbers in one run
        is marked at once, any other number in a short step of its own (its cursor's
        ordinals acked together at the end). Returns the numbers not of a current run
        delivery (settled one by one as entries, or stale), in ascending order, and how
        many were acked."""
        numbers = sorted(numbers)  # acks out of order make stretches again (in C)
        end = len(numbers)
        # where each stretch of consecutive numbers starts, found once (in C)
        steps = map(sub, islice(numbers, 1, None), numbers)
        starts = list(compress(count(1), map(ne, steps, repeat(1))))
        rest: list[int] = []
        acked = i = 0
        run: Any = None
        lo = hi = 0  # the numbers of ``run``
        theirs = False  # ``run`` was delivered to another stream
        singles: dict[ExtentCursor, list[int]] = {}  # ordinals acked one by one
        ordinals: list[int] = []
        ages: list[int] = []
        while i < end:
            no = numbers[i]
            if not lo <= no < hi:
                run = self._run_of(no)
                if run is None:
                    rest.append(no)  # an entry's, or stale
                    lo = hi = 0
                    i += 1
                    continue
                lo, hi = run.first, run.first + run.n
                theirs = owner is not None and run.owner is not owner
                ordinals = singles.setdefault(run.cursor, [])
            at = no - lo
            settled = run.settled
            if theirs or settled[at]:  # acked before, or taken out as an entry
                rest.append(no)
                i += 1
                continue
            if i + 1 < end and numbers[i + 1] == no + 1 and no + 1 < hi:
                # a stretch of consecutive numbers, to its end or its run's
                k = bisect_right(starts, i)
                n = min(starts[k] if k < len(starts) else end, i + hi - no) - i
                out = settled.find(1, at, at + n)
                if out != -1:
                    n = out - at
                settled[at : at + n] = b"\x01" * n
                stretch = list(map(ENQUEUED, run.records[at : at + n]))
                if stretch.count(stretch[0]) == n:  # published together: one enqueue time
                    enqueued[stretch[0]] += n
                else:
                    enqueued.update(stretch)
                run.cursor.ack.ack_range(run.ordinal + at, n)
            else:
                n = 1
                settled[at] = 1
                ages.append(run.records[at].enqueued_ms)
                ordinals.append(run.ordinal + at)
            run.left -= n
            if not run.left:
                self._forget_run(run)
                lo = hi = 0
            acked += n
            i += n
        for cursor, some in singles.items():
            if some:
                cursor.ack.ack_many(some)
        if ages:
            enqueued.update(ages)
        return rest, acked

    def nack(self, numbers: list[int], delay: float, owner: Any = None) -> list[int]:
        self._take_out(numbers)
        settled, stale = self._settle(numbers, owner)
        self.nacked += len(settled)
        self._park(settled, delay)
        return stale

    def extend(self, numbers: list[int], visibility: float, owner: Any = None) -> list[int]:
        deadline = time.monotonic() + visibility
        self._take_out(numbers)
        stale = []
        for no in numbers:
            entry = self.inflight.get(no)
            if entry is None or (owner is not None and entry.owner is not owner):
                stale.append(no)
                continue
            entry.deadline = deadline
            heapq.heappush(self._timeouts, (deadline, no))
            self._timers_due.set()
        return stale

    def release_owner(self, owner: Any) -> None:
        """A stream closed: what it held is parked, due at once."""
        self._unrun_where(lambda run: run.owner is owner)
        held = [no for no, e in self.inflight.items() if e.owner is owner]
        self._park(self._settle(held, owner)[0], 0.0)

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
            self._room.set()

    def _redeliver(self, entries: list[Entry]) -> None:
        """Parked entries whose next delivery is counted: deliver them first."""
        self.ready.extendleft(reversed(entries))
        self._signal_ready()

    def _release_due(self, now_ms: int) -> None:
        unread = []
        for parked in self.parked.due(now_ms):
            if parked.entry is None:
                unread.append(parked)
            else:
                self._requeue(parked, parked.entry, now_ms)
        if unread:
            task = asyncio.create_task(self._read_parked(unread))
            self._reading.add(task)
            task.add_done_callback(self._reading.discard)

    def _requeue(self, parked: Parked, entry: Entry, now_ms: int) -> None:
        """A due parked message: to the DLQ at the delivery limit, else counted again."""
        retention_ms = self.queue.config.retention_seconds * 1000
        if now_ms > entry.record.enqueued_ms + retention_ms:
            self.parked.forget(parked)
        elif parked.count >= self.group.config.max_delivery_count:
            parked.state = OUT
            self._dlq_pending.append(entry)
            if self._dlq_task is None or self._dlq_task.done():
                self._dlq_task = asyncio.create_task(self._flush_dead_letters())
        else:
            self.parked.bump(parked)

    async def _read_parked(self, unread: list[Parked]) -> None:
        """Bodies of due parked messages not kept in memory, read again by key."""
        for parked in unread:
            if parked.state == GONE:  # its extent was dropped here meanwhile
                continue
            cursor = self.cursors.get(parked.extent)
            if cursor is None:  # its extent was deleted (retention, or its queue's contents)
                self.parked.forget(parked)
                continue
            try:
                record = await read_one(self.reads.stores, cursor.extent, parked.key)
            except CheramiError as err:
                log.warning("group %s: parked message %s of %s could not be read: %s",
                            self.key, seq_of(parked.key), parked.extent, err)  # fmt: skip
                self.parked.retry(parked, int(time.time() * 1000) + RETRY_READ_MS)
                continue
            if record is None:  # deleted by retention
                self.parked.forget(parked)
                continue
            msg_id = record.orig_id or message_id(parked.extent, seq_of(parked.key))
            entry = Entry(cursor, -1, msg_id, record, parked.key)  # -1: the level is past it
            entry.count = parked.count
            entry.row = parked
            parked.entry = entry
            self._requeue(parked, entry, int(time.time() * 1000))

    def load_parked(
        self, rows: list[Redelivery], extents: set[str], levels: dict[str, AckLevel]
    ) -> None:
        """The redelivery rows of extents taken here, before their reads start."""
        self.parked.load(
            rows, extents, {e: lv.level for e, lv in levels.items()},
            self.group.config.max_delivery_count, int(time.time() * 1000),
        )  # fmt: skip
        self._timers_due.set()

    def _pin_held(self, now: float) -> None:
        """With the read window full, deliveries in flight at its head since the last
        check (and every delivery made before them) get a row, so the window moves past
        them while they stay in flight."""
        self._pin_at = now + PIN_CHECK
        if self.outstanding() < timing.current.read_ahead:
            self._held.clear()
            return
        heads = {no for c in self.cursors.values() if (no := self._head_number(c))}
        held, self._held = heads & self._held, heads
        if not held:
            return
        newest = max(held)
        self._unrun_where(lambda run: run.first <= newest)  # a row each, as for any delivery
        now_ms = int(time.time() * 1000)
        for entry in self.inflight.values():
            if entry.no <= newest and entry.row is None:
                self.parked.pin(entry, now_ms + int(max(0.0, entry.deadline - now) * 1000))

    async def _flush_dead_letters(self) -> None:
        while self._dlq_pending:
            batch, self._dlq_pending = self._dlq_pending[:500], self._dlq_pending[500:]
            try:
                await self._dead_letter(self, batch)
            except Exception as err:
                log.warning("group %s: moving %d to the DLQ failed: %s", self.key, len(batch), err)
                self._dlq_pending[:0] = batch
                await asyncio.sleep(1.0)
                continue
            for entry in batch:
                entry.cursor.ack.ack(entry.ordinal)
                if entry.row is not None:
                    self.parked.forget(entry.row)
            self.dead_lettered += len(batch)
            self._room.set()

    # timers
    async def _tick_loop(self) -> None:
        """Wakes when the group's next timer is due (a visibility timeout, a parked
        message, the full window's check), at most every TICK and at least every
        MAX_TICK while it has deliveries, parked rows or dead letters to look after; a
        new timer wakes it early. An idle group's ticker waits, costing nothing."""
        while True:
            if not self._has_timers():
                self._timers_due.clear()
                await self._timers_due.wait()
            self._timers_due.clear()
            wait = max(TICK, self._next_timer_in(time.monotonic()))
            try:
                async with asyncio.timeout(wait):
                    await self._timers_due.wait()
                await asyncio.sleep(TICK)  # what a burst of new timers brings, together
            except TimeoutError:
                pass
            self._expire(time.monotonic())

    def _next_timer_in(self, now: float) -> float:
        """Seconds until the first of the group's timers is due (MAX_TICK at most)."""
        first = now + MAX_TICK
        if self._timeouts:
            first = min(first, self._timeouts[0][0])
        due_ms = self.parked.next_due_ms()
        if due_ms is not None:
            first = min(first, now + (due_ms - time.time() * 1000) / 1000)
        if self.outstanding() >= timing.current.read_ahead:
            first = min(first, self._pin_at)
        return first - now

    def _has_timers(self) -> bool:
        return bool(
            self._timeouts or self.inflight or self._runs or self.parked.rows
            or self._dlq_pending
        )  # fmt: skip

    def _expire(self, now: float) -> None:
        timeouts, inflight = self._timeouts, self.inflight
        fired = False
        while timeouts and timeouts[0][0] <= now:
            heapq.heappop(timeouts)
            fired = True
        if fired:
            self._unrun_where(lambda run: run.deadline <= now)
            # a batch shares one timer, so collect every delivery whose deadline passed
            expired = [e for e in inflight.values() if e.deadline <= now]
            for entry in expired:
                del inflight[entry.no]
                entry.no = 0
                entry.owner = None
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

    @staticmethod
    def _head_number(cursor: ExtentCursor) -> int:
        """The delivery number of the oldest message of the cursor not acked yet (0:
        none, or not in flight)."""
        head = cursor.ack.oldest()
        return 0 if head is None or head[1] is None else head[1].number_at(head[0])
