"""Reads one extent for one consumer group, from one of its replicas, into the group's
ready queue: in order, bounded by the group's read-ahead window, tailing open extents."""

from __future__ import annotations

import asyncio
import bisect
import logging
import random
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Protocol

from cherami.errors import CheramiError
from cherami.metadata.models import AckLevel, Extent
from cherami.roles.outputhost.ackmanager import AckManager
from cherami.roles.outputhost.entry import Delivered, Entry, Run
from cherami.roles.outputhost.sharedreads import SharedReads, decode_chunk
from cherami.roles.storehost.client import StoreError
from cherami.wire.records import Record
from cherami.wire.store import TIMER

log = logging.getLogger("cherami.outputhost.extentreader")

READ_BATCH = 2000  # records per read of a store host (fewer round trips when far behind)
# how long a read waits at the store host for records to come (committed, or due on a
# timer extent; a seal or a drop ends the wait too): an idle extent costs one read per
# wait, so the wait is long. A store host cut off is noticed by its connection's
# liveness check (storehost/client.py, every 2 s while a read waits), not at the end of
# this wait. Each read waits a random part of it more (tail_wait_ms), so that the reads
# of many idle groups loaded together (a restart) do not all end, and come again, in the
# same second every ten minutes.
TAIL_WAIT_MS = 600_000


def tail_wait_ms(draw: Callable[[], float] = random.random) -> int:
    """How long one read waits: between 80% and all of TAIL_WAIT_MS."""
    return int(TAIL_WAIT_MS * (0.8 + 0.2 * draw()))


SHUN_SECONDS = 5.0  # a replica whose read failed is not read again for this long
# every replica failed in a row: the reader pauses, longer each time up to the cap (a
# power loss left 400 readers trying 3 dead replicas every 0.5 s: 2,400 failed
# connects and warnings a second on the output host while the store hosts restarted)
PAUSE_FIRST, PAUSE_MOST = 0.5, 2.0
ORIG_ID = attrgetter("orig_id")
ENQUEUED = attrgetter("enqueued_ms")


class ExtentCursor:
    """A group's position in one extent: ack tracking plus the read position."""

    def __init__(self, extent: Extent, level: AckLevel) -> None:
        self.extent = extent
        self.ack: AckManager[Entry | Run | Delivered] = AckManager(level.level, level.acked)
        self.read_key = level.level
        self.limit = level.limit  # merged DLQ range: read no further than this key
        self.read_done = False
        # every record committed before this time (epoch ms) has been read (keygate.py)
        self.seen_ms = 0.0
        self.tailing = False  # its last read found no more than it asked for: caught up
        # its reader waits on a read at read_key, all it read before admitted (keygate.py
        # probes it: a full read, then a tail read that waits for new records, is not
        # ``tailing`` and may wait minutes)
        self.in_read = False
        self.delivered = self.delivered_bytes = 0  # deliveries from it (load reports)
        self.task: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        return self.extent.id

    def follow(self, extent: Extent, limit: bytes | None) -> None:
        """The extent's record changed (sealed, moved), or a merged DLQ range grew."""
        self.extent = extent
        if limit is not None and limit != self.limit:
            self.limit = limit
            self.read_done = False

    def seen(self, records: list[Record], asked_ms: float) -> None:
        """A read brought ``records``: a record enqueued later than another was committed
        was appended after it; a read that came back short had every record committed
        before it was asked (``asked_ms``; 0: it was full)."""
        if records:
            self.seen_ms = max(self.seen_ms, max(map(ENQUEUED, records)))
        if asked_ms:
            self.seen_ms = max(self.seen_ms, asked_ms)
        self.tailing = bool(asked_ms)

    def head_number(self) -> int:
        """The delivery number of the oldest message not acked yet (0: none, or not in
        flight)."""
        head = self.ack.oldest()
        return 0 if head is None or head[1] is None else head[1].number_at(head[0])

    def level_row(self, queue: str, group: str) -> AckLevel:
        return AckLevel(
            queue=queue, group=group, extent=self.id, level=self.ack.level,
            acked=self.ack.acked, limit=self.limit,
        )  # fmt: skip


class ReadTarget(Protocol):
    """Where an extent's reader puts what it reads: a group's read window
    (readwindow.py)."""

    key: str
    stopped: bool

    @property
    def delay_ms(self) -> int: ...

    async def wait_for_room(self, cursor: ExtentCursor) -> int: ...

    async def admit(self, run: Run) -> None: ...

    def read_further(self) -> None:
        """The cursor's ``seen_ms`` moved, or it was read to its end."""


def _run(cursor: ExtentCursor, keys: list[bytes], records: list[Record], ids: list[str]) -> Run:
    """A run of records read in order, tracked by the cursor's ack manager."""
    if any(map(ORIG_ID, records)):  # moved from a DLQ: such a message keeps its id
        ids = [record.orig_id or msg_id for record, msg_id in zip(records, ids, strict=True)]
    run = Run(cursor, cursor.ack.next_ordinal(), keys, records, ids)
    cursor.ack.track_many(keys, [run] * len(keys))
    return run


async def read_extent(group: ReadTarget, cursor: ExtentCursor, reads: SharedReads) -> None:
    """Run until the extent is read to its end (sealed) or to the cursor's limit.

    Reads take turns over the replicas (every replica holds what readers may see), so
    the read load of a busy extent is spread instead of slowing one store host's appends;
    a replica that fails a read is left alone for a while, and only when every replica
    failed in a row does the reader pause. Reads of plain extents are shared with the
    other groups reading the same position (sharedreads.py).

    The end of a sealed extent is believed once two replicas report it at the same
    position (or every other replica is failing): a replica that was cut off while the
    extent was sealed can hold fewer records than the others."""
    replica = hash((group.key, cursor.id))
    failures = 0
    pause = PAUSE_FIRST
    shunned: dict[str, float] = {}  # replica -> monotonic time it may be read again
    end_key: bytes | None = None  # where replicas reported the end, and which ones
    end_votes: set[str] = set()
    timer = cursor.extent.kind == TIMER
    while not cursor.read_done and not group.stopped:
        room = await group.wait_for_room(cursor)
        replicas = cursor.extent.stores
        for _ in replicas:  # the next replica in turn that has not failed lately
            store_id = replicas[replica % len(replicas)]
            replica += 1
            if shunned.get(store_id, 0.0) <= time.monotonic():
                break
        count = min(room, READ_BATCH)
        try:
            if timer:
                due_by = int(time.time() * 1000) - group.delay_ms
                batch = await reads.stores.get(store_id).read(
                    cursor.id,
                    cursor.read_key,
                    count,
                    until_ms=due_by,
                    wait_ms=tail_wait_ms(),
                    joined=True,
                )
                chunk = decode_chunk(store_id, cursor.id, batch, timer=True)
            else:
                cursor.in_read = True
                try:
                    chunk = await reads.read(
                        store_id, cursor.id, cursor.read_key, count, tail_wait_ms()
                    )
                finally:
                    cursor.in_read = False
                store_id = chunk.store_id  # another group's read of the same position
        except CheramiError as err:
            if isinstance(err, StoreError) and err.code == "extent_not_found":
                cursor.read_done = True  # deleted (retention, or its queue's contents)
                group.read_further()
                return
            # once a failing streak, not at every try of it
            shy = shunned.get(store_id, 0.0) > time.monotonic()
            log.log(logging.DEBUG if shy else logging.WARNING,
                    "group %s: read of extent %s on %s failed: %s",
                    group.key, cursor.id, store_id, err)  # fmt: skip
            shunned[store_id] = time.monotonic() + SHUN_SECONDS
            failures += 1
            if failures >= len(replicas):
                failures = 0
                await asyncio.sleep(pause)
                pause = min(pause * 2, PAUSE_MOST)
            continue
        failures, pause = 0, PAUSE_FIRST
        shunned.pop(store_id, None)
        ended = False
        keys, records, ids = chunk.keys, chunk.records, chunk.ids
        if cursor.limit is not None and keys and keys[-1] > cursor.limit:
            n = bisect.bisect_right(keys, cursor.limit)  # a merged DLQ range ends
            keys, records, ids = keys[:n], records[:n], ids[:n]
            ended = True
        if keys:
            run = _run(cursor, keys, records, ids)
            cursor.read_key = keys[-1]
            await group.admit(run)
        if not timer:  # after the admit: what it read is in the window first
            cursor.seen(records, chunk.asked_ms)
            group.read_further()
        if cursor.limit is not None and cursor.read_key >= cursor.limit:
            ended = True
        if chunk.end and not ended:
            if end_key != cursor.read_key:
                end_key, end_votes = cursor.read_key, set()
            end_votes.add(store_id)
            now = time.monotonic()
            others = [r for r in replicas if r not in end_votes and shunned.get(r, 0.0) <= now]
            ended = len(end_votes) >= 2 or not others
        if ended:
            cursor.read_done = True
            group.read_further()
