"""A consumer group's deliveries in flight: what was taken from the ready queue and not
settled yet, behind one take / settle / expire interface.

A delivery is an ``Entry`` (one message, one number) or, on a stream's fast path, a
``Delivered`` run (consecutive numbers for consecutive messages, settled by ranges;
entry.py). Anything a run cannot say (a nack, an extend, a timeout, a closed stream)
turns the messages concerned into entries first, inside this module; callers see
numbers, entries and counts. One visibility timer is kept per batch taken."""

from __future__ import annotations

import heapq
import itertools
import time
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable
from itertools import accumulate, compress, count, islice, repeat
from operator import attrgetter, ne, sub
from typing import TYPE_CHECKING, Any

from cherami.loadmeter import Activity
from cherami.roles.outputhost.entry import BODY, ENQUEUED, EXPIRES, Delivered, Entry, Run
from cherami.wire.records import expired

if TYPE_CHECKING:
    from cherami.roles.outputhost.extentreader import ExtentCursor
    from cherami.roles.outputhost.keygate import KeyGate
    from cherami.roles.outputhost.redelivery import Parked

MIN_RUN = 16  # fewer messages than this taken at once (a short read, little credit
# left) are delivered as entries: a run each would cost more than it saves

# runs an iterator to its end in C (numbers handed out to a run, skipped past)
_skip: Callable[[Iterable[int]], None] = deque[int](maxlen=0).extend
RECORD = attrgetter("record")


class InFlight:
    """The deliveries of one group, by delivery number. ``numbers`` hands out delivery
    numbers (shared by the host's groups: a number names one delivery); ``forget_row``
    drops the redelivery row of a message settled for good; ``freed`` is told when
    messages leave the read window (acked, or expired unread); ``gate`` of messages
    settled for good that hold their ordering key. ``clock`` tells the time (seconds
    since the epoch) a message's own TTL is compared with; ``expired`` counts the
    messages acked past unseen because their TTL had passed."""

    def __init__(
        self,
        numbers: itertools.count[int],
        forget_row: Callable[[Parked], None],
        freed: Callable[[], None],
        gate: KeyGate,
    ) -> None:
        self._numbers = numbers
        self._gate = gate
        self._forget_row = forget_row
        self._freed = freed
        self.entries: dict[int, Entry] = {}  # delivered one by one, by delivery number
        self._runs: dict[int, Delivered] = {}  # delivered as runs, by first number
        self._firsts: list[int] = []  # the keys of _runs, in order
        self._timeouts: list[tuple[float, int]] = []  # (deadline, a number), a heap
        self.clock: Callable[[], float] = time.time
        self.expired = 0
        # told of each cursor that delivers (load reports; the host's, set by service.py)
        self.activity = Activity()

    def __len__(self) -> int:
        return len(self.entries) + sum(run.left for run in self._runs.values())

    def __bool__(self) -> bool:
        return bool(self.entries or self._runs or self._timeouts)

    def outlived(self, entry: Entry) -> bool:
        """Whether the message's own TTL has passed (counted in ``expired``)."""
        if expired(entry.record, self.clock() * 1000):
            self.expired += 1
            return True
        return False

    def next_deadline(self) -> float | None:
        return self._timeouts[0][0] if self._timeouts else None

    def cursor_of(self, no: int) -> ExtentCursor | None:
        """The cursor of the current delivery ``no`` (None: not current)."""
        entry = self.entries.get(no)
        if entry is not None:
            return entry.cursor
        run = self._run_of(no)
        return None if run is None else run.cursor

    # take
    def take(
        self,
        ready: deque[Entry | Run],
        limit: int,
        deadline: float,
        owner: Any,
        max_bytes: int,
        runs: bool,
        not_acting: set[str] | None,
        expired_before: float,
    ) -> tuple[list[Entry | Delivered], int, int]:
        """Deliver up to ``limit`` messages from the head of ``ready`` (and, with
        ``max_bytes``, no more bodies than fit in that many bytes, but always at least
        one), skipping those of the extents in ``not_acting`` (they stay ready) and
        acking unseen those enqueued before ``expired_before`` and those whose own TTL
        has passed (counted in ``expired``). With ``runs``, messages
        read in a row and never delivered go as runs. Returns the deliveries, how many
        messages they hold and how many of those were delivered before."""
        taken: list[Entry | Delivered] = []
        count = 0
        passed: list[Entry | Run] = []  # of extents this host may not act for now
        inflight, numbers = self.entries, self._numbers
        size = 0  # of the bodies taken and the one that did not fit
        last = 0  # the last delivery number given
        # deliveries and bytes per cursor, counted for a run of one cursor at a time
        cursor: Any = None
        run = run_bytes = redelivered = 0
        now_ms = self.clock() * 1000
        while ready and count < limit:
            entry = ready.popleft()
            if not_acting and entry.cursor.id in not_acting:
                passed.append(entry)
                continue
            if isinstance(entry, Run):
                if not runs or not_acting:
                    ready.extendleft(reversed(entry.entries()))
                    continue
                if min(len(entry), limit - count) < MIN_RUN:  # a few: entries, not a run
                    few = entry.entries(limit - count)
                    if len(entry):
                        ready.appendleft(entry)
                    ready.extendleft(reversed(few))
                    continue
                room = max_bytes - size if max_bytes else None
                fits = self._run_fits(entry, limit - count, room, count, expired_before, now_ms)
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
            expires = record.expires_ms
            if record.enqueued_ms < expired_before or (expires is not None and expires <= now_ms):
                # never deliver an expired message (past retention, or its own TTL)
                self.expired += expires is not None and expires <= now_ms
                entry.cursor.ack.ack(entry.ordinal)
                if entry.row is not None:
                    self._forget_row(entry.row)
                if self._gate:
                    self._gate.done([entry])  # its key moves on
                self._freed()
                continue
            body = len(record.body)
            if max_bytes:
                size += body
                if size > max_bytes and taken:
                    ready.appendleft(entry)
                    break
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
                    self.activity.touch(cursor)
                cursor, run, run_bytes = entry.cursor, 0, 0
            run += 1
            run_bytes += body
        if cursor is not None:
            cursor.delivered += run
            cursor.delivered_bytes += run_bytes
            self.activity.touch(cursor)
        if passed:
            ready.extendleft(reversed(passed))
        if taken:
            heapq.heappush(self._timeouts, (deadline, last))  # one timer a batch; see expire
        return taken, count, redelivered

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
        self.activity.touch(cursor)
        return made

    @staticmethod
    def _run_fits(
        run: Run, limit: int, room: int | None, count: int, expired_before: float, now_ms: float
    ) -> tuple[int, int] | None:
        """How many of a ready run's next messages to deliver now (at most ``limit``,
        bodies in ``room`` bytes unless ``room`` is None, at least one when nothing was
        taken yet), and their body bytes; None when one of them has expired."""
        pos = run.pos
        records = run.records[pos : pos + limit]
        if min(map(ENQUEUED, records)) < expired_before:
            return None
        if min(filter(None, map(EXPIRES, records)), default=now_ms + 1) <= now_ms:  # in C
            return None
        sizes = list(accumulate(map(len, map(BODY, records))))
        n = len(records)
        if room is not None:
            n = bisect_right(sizes, room)
            if not n and not count:
                n = 1
        return n, (sizes[n - 1] if n else 0)

    # settle
    def ack(self, numbers: list[int], owner: Any = None) -> tuple[list[int], int, Counter[int]]:
        """Ack current deliveries (of ``owner``, unless None) in their cursors. Returns
        the numbers that were stale, how many were acked, and the acked messages'
        enqueue times (ms, counted). The hot path of consuming: numbers delivered as a
        run settle as ranges; the rest in one pass, each cursor's ordinals together."""
        enqueued: Counter[int] = Counter()  # a batch's messages mostly share a few
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
                    self._forget_row(entry.row)
            cursor.ack.ack_many(ordinals)
            acked += len(settled)
            if self._gate:  # only while some key is held (the unkeyed path pays nothing)
                self._gate.done(settled)
        return stale, acked, enqueued

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

    def settle(self, numbers: list[int], owner: Any = None) -> tuple[list[Entry], list[int]]:
        """End current deliveries without an ack (a nack): their entries, and the
        numbers that were stale."""
        self._take_out(numbers)
        return self._settle(numbers, owner)

    def _settle(self, numbers: list[int], owner: Any) -> tuple[list[Entry], list[int]]:
        settled: list[Entry] = []
        stale: list[int] = []
        inflight = self.entries
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

    def extend(self, numbers: list[int], deadline: float, owner: Any = None) -> list[int]:
        """Move current deliveries' visibility deadline; returns the stale numbers."""
        self._take_out(numbers)
        stale = []
        for no in numbers:
            entry = self.entries.get(no)
            if entry is None or (owner is not None and entry.owner is not owner):
                stale.append(no)
                continue
            entry.deadline = deadline
            heapq.heappush(self._timeouts, (deadline, no))
        return stale

    def release(self, owner: Any) -> list[Entry]:
        """A stream closed: what it held, ended without an ack."""
        self._unrun_where(lambda run: run.owner is owner)
        held = [no for no, e in self.entries.items() if e.owner is owner]
        return self._settle(held, owner)[0]

    def expire(self, now: float) -> list[Entry]:
        """The deliveries whose visibility deadline passed, ended without an ack."""
        timeouts = self._timeouts
        fired = False
        while timeouts and timeouts[0][0] <= now:
            heapq.heappop(timeouts)
            fired = True
        if not fired:
            return []
        self._unrun_where(lambda run: run.deadline <= now)
        # a batch shares one timer, so collect every delivery whose deadline passed
        inflight = self.entries
        expired = [e for e in inflight.values() if e.deadline <= now]
        for entry in expired:
            del inflight[entry.no]
            entry.no = 0
            entry.owner = None
        return expired

    def drop_cursor(self, cursor: ExtentCursor) -> None:
        """Forget the deliveries of an extent this host no longer holds (their numbers
        go stale)."""
        for no in [no for no, e in self.entries.items() if e.cursor is cursor]:
            entry = self.entries.pop(no)
            entry.no = 0
            entry.owner = None
        for run in [d for d in self._runs.values() if d.cursor is cursor]:
            self._forget_run(run)

    def through(self, newest: int) -> list[Entry]:
        """The deliveries numbered ``newest`` or lower, as entries (runs turned into
        entries first: each is to get a redelivery row of its own)."""
        self._unrun_where(lambda run: run.first <= newest)
        return [e for e in self.entries.values() if e.no <= newest]

    # runs
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

    def _unrun_where(self, which: Callable[[Delivered], bool]) -> None:
        """Delivered runs' unsettled messages become entries in flight."""
        inflight = self.entries
        for run in [d for d in self._runs.values() if which(d)]:
            self._forget_run(run)
            for entry in run.entries():
                inflight[entry.no] = entry

    def _take_out(self, numbers: Iterable[int]) -> None:
        """The deliveries named that are in runs become entries in flight (a nack or an
        extend settles them one by one; the rest of their runs stay as they are)."""
        if not self._runs:
            return
        inflight = self.entries
        for no in numbers:
            run = self._run_of(no)
            if run is None:
                continue
            entry = run.take_out(no)
            if entry is not None:
                inflight[no] = entry
                if not run.left:
                    self._forget_run(run)
