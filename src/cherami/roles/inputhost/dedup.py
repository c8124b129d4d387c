"""Deduplication of publishes by ``dedup_id``: a message whose ``dedup_id`` the queue took
within its dedup window (``dedup_window_seconds``, default 10 minutes) is not stored
again; the publisher gets the id of the message stored the first time.

The id is stored in the record, so the window survives an input host failover: when an
input host first takes a publish with a ``dedup_id`` for a queue (and again after the
queue's extents changed), it rebuilds the queue's window from the records its extents
hold that were enqueued within the window. Two publishes of one id at the same time
store it once: the second waits for the first."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from cherami.errors import CheramiError, InvalidRequest, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import FAILING, OPEN, SEALED, Extent, Queue
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.keys import plain_key, seq_of
from cherami.wire.records import Message, decode_record, message_id
from cherami.wire.store import PLAIN

log = logging.getLogger("cherami.inputhost.dedup")

MAX_DEDUP_ID = 128  # characters
MAX_IDS = 2_000_000  # per queue: beyond it the oldest ids leave the window early
SCAN_BATCH = 1000
SLACK_MS = 5000  # concurrent appends may store records a little out of time order

Append = Callable[[Queue, list[Message]], Awaitable[list[str]]]


def check_dedup_ids(messages: list[Message]) -> None:
    for i, m in enumerate(messages):
        if m.dedup_id is not None and not 1 <= len(m.dedup_id) <= MAX_DEDUP_ID:
            raise InvalidRequest(f"messages[{i}].dedup_id must have 1 to {MAX_DEDUP_ID} characters")


class Window:
    """The dedup ids one queue took lately: id -> (message id, expiry in epoch ms), in
    the order they were taken."""

    def __init__(self) -> None:
        self.ids: dict[str, tuple[str, int]] = {}
        self.pending: dict[str, asyncio.Future[None]] = {}  # being stored: done when stored
        self.loaded = False
        self.lock = asyncio.Lock()

    def get(self, dedup_id: str, now_ms: int) -> str | None:
        known = self.ids.get(dedup_id)
        return known[0] if known is not None and known[1] > now_ms else None

    def put(self, dedup_id: str, msg_id: str, expires_ms: int) -> None:
        self.ids.pop(dedup_id, None)
        self.ids[dedup_id] = (msg_id, expires_ms)

    def expire(self, now_ms: int) -> None:
        while self.ids:
            oldest = next(iter(self.ids))
            if self.ids[oldest][1] > now_ms and len(self.ids) <= MAX_IDS:
                return
            del self.ids[oldest]


class Deduplicator:
    def __init__(self, metadata: MetadataStore, stores: StoreDirectory) -> None:
        self.metadata = metadata
        self.stores = stores
        self._windows: dict[str, Window] = {}
        self.dropped = 0  # repeats not stored again, since start

    def forget(self, queue: str) -> None:
        """The queue was deleted: its window goes."""
        self._windows.pop(queue, None)

    def stale(self, queue: str) -> None:
        """The queue's extents changed (one may have come from another input host)."""
        window = self._windows.get(queue)
        if window is not None:
            window.loaded = False

    async def publish(self, queue: Queue, messages: list[Message], append: Append) -> list[str]:
        """Publish through ``append`` the messages whose ``dedup_id`` (if any) the queue
        has not taken within its window; answer every message's id in order."""
        check_dedup_ids(messages)
        window_ms = int(queue.config.dedup_window_seconds * 1000)
        if window_ms <= 0:
            return await append(queue, messages)
        window = await self._window(queue, window_ms)
        now_ms = int(time.time() * 1000)
        window.expire(now_ms)
        ids = [""] * len(messages)
        fresh: list[int] = []  # indexes of the messages to store
        waits: list[tuple[int, str, asyncio.Future[None]]] = []
        mine: list[str] = []  # the dedup ids this call stores, all under one future
        done: asyncio.Future[None] | None = None
        pending, get = window.pending, window.ids.get
        for i, m in enumerate(messages):
            d = m.dedup_id
            if d is None:
                fresh.append(i)
                continue
            known = get(d)
            if known is not None and known[1] > now_ms:
                ids[i] = known[0]
            elif d in pending:
                waits.append((i, d, pending[d]))
            else:
                if done is None:
                    done = asyncio.get_running_loop().create_future()
                fresh.append(i)
                mine.append(d)
                pending[d] = done
        self.dropped += len(messages) - len(fresh)
        try:
            made = await append(queue, [messages[i] for i in fresh]) if fresh else []
        except BaseException:
            for d in mine:
                pending.pop(d, None)
            if done is not None:
                done.cancel()
            raise
        expires = int(time.time() * 1000) + window_ms
        for i, msg_id in zip(fresh, made, strict=True):
            ids[i] = msg_id
            d = messages[i].dedup_id
            if d is not None and pending.get(d) is done:
                window.put(d, msg_id, expires)
                del pending[d]
        if done is not None:
            done.set_result(None)
        for i, d, future in waits:
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                if not future.cancelled():
                    raise
            stored = window.get(d, int(time.time() * 1000))
            if stored is None:
                raise Unavailable(
                    f"messages[{i}]: the publish of the same dedup_id at the same time failed; "
                    "publish again"
                )
            ids[i] = stored
        return ids

    async def _window(self, queue: Queue, window_ms: int) -> Window:
        window = self._windows.setdefault(queue.name, Window())
        if window.loaded:
            return window
        async with window.lock:
            if not window.loaded:
                started = time.monotonic()
                found = await self._recent(queue.name, window_ms)
                for d, (msg_id, expires) in sorted(found.items(), key=lambda kv: kv[1][1]):
                    if d not in window.ids:
                        window.put(d, msg_id, expires)
                window.loaded = True
                log.info("queue %s: dedup window rebuilt from the store: %d ids in %.2f s",
                         queue.name, len(found), time.monotonic() - started)  # fmt: skip
        return window

    async def _recent(self, queue: str, window_ms: int) -> dict[str, tuple[str, int]]:
        """The dedup ids of the records the queue's extents hold that were enqueued
        within the window: id -> (message id, expiry)."""
        since_ms = int(time.time() * 1000) - window_ms
        found: dict[str, tuple[str, int]] = {}
        for extent in await self.metadata.list_extents(queue, (OPEN, FAILING, SEALED)):
            try:
                after = await self._first_recent(extent, since_ms - SLACK_MS)
                while True:
                    batch = await self.stores.read(extent, after, SCAN_BATCH)
                    for key, raw in zip(batch.keys, batch.records, strict=True):
                        record = decode_record(raw)
                        if record.dedup_id is not None and record.enqueued_ms >= since_ms:
                            expires = record.enqueued_ms + window_ms
                            found[record.dedup_id] = (message_id(extent.id, seq_of(key)), expires)
                    if len(batch.keys) < SCAN_BATCH:
                        break
                    after = batch.keys[-1]
            except CheramiError as err:
                raise Unavailable(
                    f"queue {queue}: cannot rebuild the dedup window from extent {extent.id}: {err}"
                ) from err
        return found

    async def _first_recent(self, extent: Extent, since_ms: int) -> bytes:
        """The key to read a plain extent after to find its records enqueued since
        ``since_ms`` (a binary search on sequence numbers: records are appended in time
        order); timer extents, ordered by due time, are read whole."""
        if extent.kind != PLAIN:
            return b""
        low, high = 1, (await self.stores.info(extent)).last_seq + 1
        while low < high:  # the first seq enqueued at or after since_ms
            mid = (low + high) // 2
            batch = await self.stores.read(extent, plain_key(mid - 1), 1)
            if batch.records and decode_record(batch.records[0]).enqueued_ms < since_ms:
                low = mid + 1
            else:
                high = mid
        return plain_key(low - 1) if low > 1 else b""
