"""The input host: accepts publishes, turns messages into records, appends them to the
queue's open extents and answers once every replica holds them."""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Iterable

from cherami.context import DEFAULT, ProcessContext
from cherami.errors import (
    ExtentSealed,
    Moved,
    QueueNotFound,
    StorageFull,
    Unavailable,
)
from cherami.loadmeter import Activity, Counts, has_room
from cherami.membership import STOREHOST
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import OPEN, Queue
from cherami.periodic import Background
from cherami.roles.controller.client import want_keyed, want_timers
from cherami.roles.inputhost.dedup import Deduplicator
from cherami.roles.inputhost.extentwriter import ExtentWriter
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.records import Message, Record, encode_record, message_ids
from cherami.wire.store import PLAIN, TIMER

log = logging.getLogger("cherami.inputhost.service")

MAX_ATTEMPTS = 5
ROOM_CHECK_INTERVAL = 1.0  # how often the store hosts' free disk is looked at
RETIRED_KEPT = 10.0  # seconds an extent given up stays in the load reports' counts
STORAGE_FULL_RETRY = 2.0  # seconds a publish refused storage_full is told to wait


Changed = dict[Hashable, tuple[str, Counts] | None]


class _QueueWriters:
    def __init__(self) -> None:
        self.plain: list[ExtentWriter] = []
        self.timer: ExtentWriter | None = None
        self.turn = itertools.count()
        self.loaded = False
        self.loaded_at = 0.0
        self.created_at = 0.0  # which queue of the name the writers serve
        self.lock = asyncio.Lock()


class InputHostService:
    def __init__(
        self,
        host_id: str,
        metadata: MetadataStore,
        stores: StoreDirectory,
        extent_failed: Callable[[str], Awaitable[None]],
        serves_every_queue: bool = True,
        ctx: ProcessContext = DEFAULT,
    ) -> None:
        """``extent_failed`` is called with an extent whose replica failed (it marks it
        FAILING: the leading controller seals it and opens what the queue needs). The
        queue's extents are read again every ``extent_refresh_interval``. A node's only
        input host serves every queue; in a cluster an input host serves only the
        queues that have extents placed on it."""
        self.host_id = host_id
        self.metadata = metadata
        self.stores = stores
        self.timing = ctx.timing
        self._extent_failed = extent_failed
        self._serves_every_queue = serves_every_queue
        self._queues: dict[str, _QueueWriters] = {}
        self._full: set[str] = set()  # store hosts below their free-disk floor
        # extents given up lately: (when, messages and bytes appended, their store hosts)
        self._retired: dict[str, tuple[float, int, int, tuple[str, ...]]] = {}
        # the open extents' writers by id, how many have a replica on each store host,
        # and which of them appended since a load report's last look (loadmeter.py)
        self._by_id: dict[str, ExtentWriter] = {}
        self._on_store: Counter[str] = Counter()
        self.activity = Activity()
        self._live_stores: set[str] = set()  # as the last look at the reports saw them
        self._full_checked = -ROOM_CHECK_INTERVAL
        self._every_store_full = False  # no new extent can be placed either
        self.background = Background("input host")
        self.dedup = Deduplicator(metadata, stores)

    async def stop(self) -> None:
        await self.background.stop()

    async def serves(self, queue: str) -> bool:
        if self._serves_every_queue:
            return True
        writers = await self._writers(queue)
        return bool(writers.plain or writers.timer)

    def extent_changes(self, version: int, store: str | None = None) -> tuple[int, Changed]:
        """Messages and bytes appended to each extent that took appends since
        ``version`` of the activity (for load reports, loadmeter.py), also to one given
        up in the last RETIRED_KEPT seconds (its last appends count in the next report: an
        extent that rolled over dropped out of them, and a queue rolling over every few
        seconds read slower than it was); with ``store``, of the extents with a replica on
        that store host. O(extents that took appends): an idle one costs nothing."""
        now = time.monotonic()
        for gone in [i for i, r in self._retired.items() if r[0] <= now - RETIRED_KEPT]:
            del self._retired[gone]
            self.activity.gone(gone)
        changed: Changed = {}
        for key in self.activity.since(version):
            eid = str(key)
            writer = self._by_id.get(eid)
            if writer is not None:
                stores: Iterable[str] = writer.extent.stores
                counts = (writer.appended, writer.appended_bytes, 0, 0)
            elif (retired := self._retired.get(eid)) is not None:
                stores, counts = retired[3], (retired[1], retired[2], 0, 0)
            else:
                changed[key] = None
                continue
            if store is None or store in stores:
                changed[key] = (eid, counts)
        return self.activity.version, changed

    def open_extents(self, store: str | None = None) -> int:
        """The extents open here (with a replica on ``store``), and those given up in
        the last RETIRED_KEPT seconds."""
        retired = sum(store is None or store in r[3] for r in self._retired.values())
        return (len(self._by_id) if store is None else self._on_store[store]) + retired

    def forget(self, queue: str) -> None:
        """The queue was deleted (its extents with it): what is kept for it goes. (An
        input host of a cluster, told by no one, forgets it at its next look at the
        queue.)"""
        writers = self._queues.pop(queue, None)
        for w in [*writers.plain, writers.timer] if writers else []:
            if w is not None:
                self._retired[w.id] = (time.monotonic(), w.appended, w.appended_bytes,
                                       tuple(w.extent.stores))  # fmt: skip
        self.dedup.forget(queue)

    def _fresh(self, writers: _QueueWriters) -> bool:
        # the controller seals, opens and moves extents: look again often
        age = time.monotonic() - writers.loaded_at
        return writers.loaded and age < self.timing.extent_refresh_interval

    async def _writers(self, queue: str) -> _QueueWriters:
        writers = self._queues.setdefault(queue, _QueueWriters())
        if self._fresh(writers):
            return writers
        async with writers.lock:
            if self._fresh(writers):
                return writers
            known = {w.id: w for w in [*writers.plain, writers.timer] if w is not None}
            plain: list[ExtentWriter] = []
            timer: ExtentWriter | None = None
            for extent in await self.metadata.list_extents(queue, (OPEN,)):
                if extent.input_host != self.host_id:
                    continue
                writer = known.get(extent.id)
                if writer is None or writer.failed:
                    writer = ExtentWriter(extent, [self.stores.get(s) for s in extent.stores])
                    writer.activity = self.activity
                    try:
                        await writer.open()
                    except Unavailable as err:
                        log.warning("extent %s cannot be opened: %s", extent.id, err)
                        self.background.spawn(self._failed(extent.id), f"fail {extent.id}")
                        continue
                if extent.kind == TIMER:
                    timer = writer
                else:
                    plain.append(writer)
            kept = {w.id for w in [*plain, timer] if w is not None}
            if kept != set(known):
                self.dedup.stale(queue)  # one may hold records another input host took
            for gone in set(known) - kept:
                w = known[gone]
                self._retired[gone] = (time.monotonic(), w.appended, w.appended_bytes,
                                       tuple(w.extent.stores))  # fmt: skip
            for old in [*writers.plain, writers.timer]:
                if old is not None and self._by_id.pop(old.id, None) is not None:
                    self._on_store.subtract(old.extent.stores)
            for new in [*plain, timer]:
                if new is not None:
                    self._by_id[new.id] = new
                    self._on_store.update(new.extent.stores)
            writers.plain, writers.timer = plain, timer
            try:
                writers.created_at = (await self.metadata.get_queue(queue)).created_at
            except QueueNotFound:
                if self._queues.get(queue) is writers:
                    self.forget(queue)
                raise
            writers.loaded = True
            writers.loaded_at = time.monotonic()
        return writers

    async def _failed(self, extent_id: str) -> None:
        try:
            await self._extent_failed(extent_id)
        except Exception as err:
            log.error("could not report extent %s failing: %s", extent_id, err)

    async def publish(self, queue: Queue, messages: list[Message]) -> list[str]:
        """Append every message durably (a repeated ``dedup_id`` within the queue's
        window only once, dedup.py); returns their ids in order."""
        if any(m.dedup_id is not None for m in messages):
            return await self.dedup.publish(queue, messages, self._publish)
        return await self._publish(queue, messages)

    async def _publish(self, queue: Queue, messages: list[Message]) -> list[str]:
        """Append every message durably; returns their ids in order. Raises
        QueueNotFound when ``queue`` was deleted since (a queue made again under its
        name is another queue: a stream opened for the old one never writes into it)."""
        writers = await self._writers(queue.name)
        if writers.created_at != queue.created_at:
            writers.loaded = False  # look again: the queue may be newer than what we know
            if (await self._writers(queue.name)).created_at != queue.created_at:
                raise QueueNotFound(f"queue {queue.name} was deleted")
        if not queue.keyed and any(m.key is not None for m in messages):
            await want_keyed(self.metadata, queue)  # before its first keyed message is in
        plain_idx, plain_records, timer_idx, timer_records, timer_due = _split(
            messages, int(time.time() * 1000), int(queue.config.delay_seconds * 1000)
        )
        ids: list[str] = [""] * len(messages)
        # find every extent the batch needs before writing any of it
        plain = await self._pick(queue, PLAIN) if plain_records else None
        timer = await self._pick(queue, TIMER) if timer_records else None
        parts = []
        if plain is not None:
            for writer, idx, records in await self._by_key(queue, plain, messages, plain_idx,
                                                           plain_records):  # fmt: skip
                parts.append(self._append(queue, writer, idx, records, None, ids))
        if timer is not None:
            parts.append(self._append(queue, timer, timer_idx, timer_records, timer_due, ids))
        await asyncio.gather(*parts)
        return ids

    async def _by_key(
        self,
        queue: Queue,
        plain: ExtentWriter,
        messages: list[Message],
        indexes: list[int],
        records: list[bytes],
    ) -> list[tuple[ExtentWriter, list[int], list[bytes]]]:
        """The plain records by the extent each goes to: a keyed message to the open
        extent its key hashes to (among the queue's open plain extents here, by id), so
        that a key stays in one extent while they do not change; the rest to ``plain``."""
        if all(messages[i].key is None for i in indexes):
            return [(plain, indexes, records)]
        live = sorted(await self._live_plain(queue), key=lambda w: w.id) or [plain]
        parts: dict[str, tuple[ExtentWriter, list[int], list[bytes]]] = {}
        for i, record in zip(indexes, records, strict=True):
            key = messages[i].key
            writer = plain if key is None else live[key_slot(key, len(live))]
            part = parts.setdefault(writer.id, (writer, [], []))
            part[1].append(i)
            part[2].append(record)
        return list(parts.values())

    async def _live_plain(self, queue: Queue) -> list[ExtentWriter]:
        writers = await self._writers(queue.name)
        return await self._with_room([w for w in writers.plain if not w.failed])

    async def _append(
        self,
        queue: Queue,
        writer: ExtentWriter,
        indexes: list[int],
        records: list[bytes],
        due: list[int] | None,
        ids: list[str],
    ) -> None:
        kind = writer.extent.kind
        for attempt in range(MAX_ATTEMPTS):
            try:
                first = await writer.append(records, due)
            except ExtentSealed:
                self._queues[queue.name].loaded = False
                await self._failed(writer.id)
                await asyncio.sleep(0.05 * attempt)
                writer = await self._pick(queue, kind)
                continue
            except StorageFull:  # a replica's disk reached its floor before a report said
                await self._storage_full(queue, writer)
                raise
            made = message_ids(writer.id, first, len(indexes))
            if len(made) == len(ids):  # the whole batch (indexes are 0, 1, ...)
                ids[:] = made
                return
            for index, msg_id in zip(indexes, made, strict=True):
                ids[index] = msg_id
            return
        raise Unavailable(f"queue {queue.name}: no extent accepted the append")

    async def _full_stores(self) -> set[str]:
        """The store hosts whose latest load report shows free disk below the floor
        (loadmeter.py); read at most once a ROOM_CHECK_INTERVAL."""
        now = time.monotonic()
        if now >= self._full_checked + ROOM_CHECK_INTERVAL:
            self._full_checked = now
            hosts = await self.metadata.list_hosts(STOREHOST, self.timing.dead_after)
            self._full = {h.id for h in hosts if not has_room(h)}
            self._live_stores = {h.id for h in hosts}
            self._every_store_full = bool(hosts) and len(self._full) == len(hosts)
        return self._full

    async def _storage_full(self, queue: Queue, writer: ExtentWriter) -> None:
        """A replica refused an append for want of disk: its store hosts count as full
        until the next look at the load reports (publishes are refused at once
        meanwhile, not sent to be refused again), and the extent is given up (sealed,
        a successor opened) only when enough other store hosts have room to hold a
        successor; else it stays open, to take appends again once space is freed (on a
        node every store host shares one disk: a successor could not be placed, and
        publishes waited for it, 10 s each, instead of being refused)."""
        self._full = await self._full_stores() | set(writer.extent.stores)
        self._full_checked = time.monotonic()
        roomy = self._live_stores - self._full
        self._every_store_full = bool(self._live_stores) and not roomy  # no successor fits
        if len(roomy) >= len(writer.extent.stores):
            self._queues[queue.name].loaded = False
            self.background.spawn(self._failed(writer.id), f"fail {writer.id}")

    async def _with_room(self, writers: list[ExtentWriter]) -> list[ExtentWriter]:
        """The writers whose every replica has room; StorageFull when none has."""
        full = await self._full_stores()
        if not writers and self._every_store_full:
            raise _storage_full(full)  # the controller cannot open an extent either
        if not full or not writers:
            return writers
        roomy = [w for w in writers if not full.intersection(w.extent.stores)]
        if not roomy:
            raise _storage_full(full)
        return roomy

    async def _pick(self, queue: Queue, kind: str) -> ExtentWriter:
        # in a cluster the queue's extents may have moved to another input host: after a
        # short wait the producer is told to reconnect (through a frontend) instead
        attempts = 100 if self._serves_every_queue else 20
        for _ in range(attempts):
            writers = await self._writers(queue.name)
            if writers.created_at != queue.created_at:  # read again since the publish began
                raise QueueNotFound(f"queue {queue.name} was deleted")
            if kind == TIMER:
                if writers.timer is not None and not writers.timer.failed:
                    (timer,) = await self._with_room([writers.timer])
                    return timer
                await want_timers(self.metadata, queue)  # its first delayed message
            else:
                live = await self._live_plain(queue)
                if live:
                    return live[next(writers.turn) % len(live)]
            writers.loaded = False  # the leading controller opens one meanwhile
            await asyncio.sleep(0.1)
        if not self._serves_every_queue:
            raise Moved(f"queue {queue.name} has no open {kind} extent on this input host")
        raise Unavailable(f"queue {queue.name} has no open {kind} extent")


def key_slot(key: str, slots: int) -> int:
    """Which of ``slots`` open extents (by id) an ordering key goes to: the same on every
    host and every run (CRC-32, not Python's salted ``hash``)."""
    return zlib.crc32(key.encode()) % slots


def _storage_full(full: set[str]) -> StorageFull:
    return StorageFull(
        f"store hosts {', '.join(sorted(full))} are below their free-disk floor; "
        "publishing goes on once space is freed",
        retry_after=STORAGE_FULL_RETRY,
    )


_delay_ms = operator.attrgetter("delay_ms")


def _split(
    messages: list[Message], now: int, default_delay: int
) -> tuple[list[int], list[bytes], list[int], list[bytes], list[int]]:
    """Encode the records; split them into those for now (plain) and delayed ones
    (timer): (plain indexes, plain records, timer indexes, timer records, due times)."""
    delays = set(map(_delay_ms, messages))  # in C
    if delays == {0} or (default_delay <= 0 and delays <= {None, 0}):  # none delayed
        encode = encode_record
        plain = [
            encode(
                Record(
                    now,
                    now,
                    m.body,
                    m.attributes,
                    m.orig_id,
                    m.text,
                    m.dedup_id,
                    m.key,
                    m.expires_ms,
                )
            )
            for m in messages
        ]
        return list(range(len(messages))), plain, [], [], []
    plain_idx: list[int] = []
    plain_records: list[bytes] = []
    timer_idx: list[int] = []
    timer_records: list[bytes] = []
    timer_due: list[int] = []
    for i, m in enumerate(messages):
        delay = default_delay if m.delay_ms is None else m.delay_ms
        due = now + delay
        record = encode_record(
            Record(
                now, due, m.body, m.attributes, m.orig_id, m.text, m.dedup_id, m.key, m.expires_ms
            )
        )
        if delay > 0:
            timer_idx.append(i)
            timer_records.append(record)
            timer_due.append(due)
        else:
            plain_idx.append(i)
            plain_records.append(record)
    return plain_idx, plain_records, timer_idx, timer_records, timer_due
