"""Message-store reads (peek): ``GET /v1/queues/{queue}/messages`` reads a queue's
retained messages without consuming them (docs/api.md "Peek").

Each plain extent is read from any of its replicas in append order; the extents are
merged by enqueue time (then message id), oldest or newest first. The cursor holds where
the listing stands in every extent, so a page goes on exactly where the one before
stopped, whatever was published since: no message twice, none skipped. Timer extents
(delayed messages) are not read. Nothing a group keeps (ack levels, deliveries) is
touched."""

from __future__ import annotations

import asyncio
import heapq
import re
from collections import deque
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from cherami.errors import CheramiError, InvalidRequest, Unavailable
from cherami.httpbase import json_response
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import CONSUMED, FAILING, OPEN, SEALED, Extent
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import parse_time, rfc3339, text_or_bytes
from cherami.roles.frontend.paging import MAX_LIMIT, limit_asked
from cherami.roles.storehost.client import StoreError
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.keys import plain_key, seq_of
from cherami.wire.records import Record, decode_record, message_id
from cherami.wire.store import PLAIN, ReadResult

# enqueue times are stamped when a publish arrives, and concurrent publishes may append in
# another order: the start and the end of a time range are looked for this much wider
SLACK_MS = 60_000
_ID = r"[A-Za-z0-9-]{1,64}"
_AT = _ID + r"_(?:[0-9]{1,19}|x)"
# order . since . until . floor . positions (see Cursor); any text it matches is a place
# (empty: the first page)
CURSOR_PATTERN = (
    rf"^(?:[ad]\.(?:-?[0-9]{{1,15}})?\.(?:-?[0-9]{{1,15}})?\.(?:[0-9]{{1,18}}_{_ID})?"
    rf"\.(?:{_AT}(?:~{_AT})*)?)?$"
)
_CURSOR = re.compile(CURSOR_PATTERN)
_ORDERS = ("asc", "desc")


class PeekMessage(msgspec.Struct, omit_defaults=True):
    id: str
    attributes: dict[str, str]
    enqueued_at: str
    body: str | None = None
    body_b64: bytes | None = None  # base64 in JSON
    key: str | None = None  # its ordering key, when it has one
    expires_at: str | None = None  # its TTL, when it has one


class PeekResponse(msgspec.Struct):
    messages: list[PeekMessage]
    cursor: str | None  # null: the last page


def _key(extent: Extent) -> tuple[int, str]:
    """Where an extent stands among its queue's: by creation."""
    return round(extent.created_at * 1_000_000), extent.id


@dataclass
class Cursor:
    """Where a listing stands. ``at``: per extent, the boundary of what was shown (asc:
    the messages above that sequence number are left; desc: those below), or None when
    the extent is done. The extents not in ``at``: those up to ``floor`` in the listing's
    order are done; the others are new since the listing began, read from their start in
    asc and left out in desc (a newest-first listing shows what there was when it began)."""

    desc: bool
    since: int | None
    until: int | None
    floor: tuple[int, str] | None = None
    at: dict[str, int | None] = field(default_factory=dict)

    def encode(self) -> str:
        floor = f"{self.floor[0]}_{self.floor[1]}" if self.floor else ""
        at = "~".join(f"{e}_{'x' if p is None else p}" for e, p in self.at.items())
        bound = ["" if t is None else str(t) for t in (self.since, self.until)]
        return ".".join(["d" if self.desc else "a", *bound, floor, at])

    @classmethod
    def decode(cls, text: str) -> Cursor:
        if not _CURSOR.fullmatch(text):
            raise InvalidRequest("malformed cursor: pass back the cursor a page answered")
        order, since, until, floor, at = text.split(".")
        cursor = cls(order == "d", int(since) if since else None, int(until) if until else None)
        if floor:
            created, extent = floor.split("_", 1)
            cursor.floor = (int(created), extent)
        for item in at.split("~") if at else ():
            extent, pos = item.rsplit("_", 1)
            cursor.at[extent] = None if pos == "x" else int(pos)
        return cursor

    def passed(self, extent: Extent) -> bool:
        """Whether ``extent`` is up to the floor in the listing's order."""
        if self.floor is None:
            return False
        return _key(extent) >= self.floor if self.desc else _key(extent) <= self.floor


class ExtentReader:
    """One extent's messages in the listing's order, read a chunk at a time from any
    replica, only those enqueued from ``since`` to before ``until``."""

    def __init__(
        self, stores: StoreDirectory, extent: Extent, cursor: Cursor, pos: int, chunk: int
    ) -> None:
        self.stores = stores
        self.extent = extent
        self.c = cursor
        self.pos = pos  # the boundary of what was shown
        self.read_to = pos  # the boundary of what was read
        self.chunk = chunk
        self.buffer: deque[tuple[int, Record]] = deque()
        self.done = False  # nothing more will ever come
        self.idle = False  # nothing more now (an open extent)
        self.misses = 0  # reads of an open extent's top that found nothing

    def head_key(self, rank: int) -> tuple[int, int, int]:
        seq, record = self.buffer[0]
        if self.c.desc:
            return -record.enqueued_ms, rank, -seq
        return record.enqueued_ms, rank, seq

    def take(self) -> tuple[int, Record]:
        seq, record = self.buffer.popleft()
        self.pos = seq
        return seq, record

    def boundary(self) -> int | None:
        """The extent's place for the cursor."""
        if self.buffer:
            return self.pos
        return None if self.done else self.read_to

    async def fill(self) -> None:
        """Read until a message is buffered or the extent has no more (for now)."""
        while not self.buffer and not self.done and not self.idle:
            if self.c.desc:
                await self._read_down()
            else:
                await self._read_up()

    def _wanted(self, record: Record) -> bool:
        since, until = self.c.since, self.c.until
        ms = record.enqueued_ms
        return (since is None or ms >= since) and (until is None or ms < until)

    async def _read_up(self) -> None:
        batch = await read_any(self.stores, self.extent, plain_key(self.read_to), self.chunk)
        if batch is None:  # deleted since it was listed
            self.done = True
            return
        until = self.c.until
        for key, raw in zip(batch.keys, batch.records, strict=True):
            seq, record = seq_of(key), decode_record(raw)
            if until is not None and record.enqueued_ms >= until + SLACK_MS:
                self.done = True
                return
            self.read_to = seq
            if self._wanted(record):
                self.buffer.append((seq, record))
        self.done = batch.end
        self.idle = not batch.records

    async def _read_down(self) -> None:
        if self.read_to <= 1:
            self.done = True
            return
        low = max(1, self.read_to - self.chunk)
        read, gone = await self._range(low, self.read_to - 1)
        if gone:  # deleted since it was listed
            self.done = True
            return
        if not read:
            # the top of an open extent may not be readable yet (replicas are read up to
            # what all of them hold); what lies below it must be
            self.misses += 1
            if self.misses > 3 or self.extent.status not in (OPEN, FAILING):
                raise Unavailable(f"extent {self.extent.id}: no replica could be read; retry")
        self.read_to = low
        since = self.c.since
        for seq, record in reversed(read):
            if since is not None and record.enqueued_ms < since - SLACK_MS:
                self.done = True
                return
            if self._wanted(record):
                self.buffer.append((seq, record))

    async def _range(self, low: int, high: int) -> tuple[list[tuple[int, Record]], bool]:
        """The messages from ``low`` to ``high`` that can be read (one read stops at
        1 MiB, so as many as it takes), and whether the extent is gone."""
        read: list[tuple[int, Record]] = []
        after = low - 1
        while after < high:
            batch = await read_any(self.stores, self.extent, plain_key(after), high - after)
            if batch is None:
                return read, True
            if not batch.records:
                return read, False
            read += zip(map(seq_of, batch.keys), map(decode_record, batch.records), strict=True)
            after = read[-1][0]
        return read, False


async def read_any(
    stores: StoreDirectory, extent: Extent, after: bytes, count: int
) -> ReadResult | None:
    """Read from the first replica that has something (a replica that restarted may
    answer empty for a while); None when the extent is gone from every replica."""
    answer: ReadResult | None = None
    error: CheramiError = Unavailable(f"extent {extent.id} has no replicas")
    gone = 0
    for store_id in extent.stores:
        try:
            batch = await stores.get(store_id).read(extent.id, after, count)
        except StoreError as err:
            if err.code != "extent_not_found":
                raise
            gone += 1
            continue
        except CheramiError as err:
            error = err
            continue
        if batch.records or batch.end:
            return batch
        answer = batch
    if answer is not None:
        return answer
    if extent.stores and gone == len(extent.stores):  # deleted since it was listed
        return None
    raise error


async def _record_at(stores: StoreDirectory, extent: Extent, seq: int) -> Record | None:
    batch = await read_any(stores, extent, plain_key(seq - 1), 1)
    return decode_record(batch.records[0]) if batch is not None and batch.records else None


async def first_since(stores: StoreDirectory, extent: Extent, last: int, ms: int) -> int:
    """The first sequence number up to ``last + 1`` enqueued at ``ms`` or later (a binary
    search: an extent is appended in time order, give or take SLACK_MS)."""
    low, high = 1, last + 1
    while low < high:
        mid = (low + high) // 2
        record = await _record_at(stores, extent, mid)
        if record is not None and record.enqueued_ms < ms:
            low = mid + 1
        else:
            high = mid
    return low


class PeekHandlers:
    def __init__(self, lookup: Lookup, metadata: MetadataStore, stores: StoreDirectory) -> None:
        self.lookup = lookup
        self.metadata = metadata
        self.stores = stores

    async def peek(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "consume")
        cursor, limit, first = asked(request)
        statuses = (OPEN, FAILING, SEALED, CONSUMED)
        extents = [e for e in await self.metadata.list_extents(queue.name, statuses)
                   if e.kind == PLAIN]  # fmt: skip
        extents.sort(key=_key, reverse=cursor.desc)
        chunk = max(20, min(limit + 1, MAX_LIMIT) // max(1, len(extents)) + 1)
        starts = await asyncio.gather(*(self._start(e, cursor, first) for e in extents))
        readers = [
            ExtentReader(self.stores, e, cursor, pos, chunk)
            for e, pos in zip(extents, starts, strict=True)
            if pos is not None
        ]
        await asyncio.gather(*(r.fill() for r in readers))
        by_id = sorted(extents, key=lambda e: e.id, reverse=cursor.desc)
        ranks = {e.id: i for i, e in enumerate(by_id)}  # ties go by message id
        heap = [(r.head_key(ranks[r.extent.id]), i) for i, r in enumerate(readers) if r.buffer]
        heapq.heapify(heap)
        shown: list[PeekMessage] = []
        while heap and len(shown) < limit:
            _, i = heapq.heappop(heap)
            reader = readers[i]
            seq, record = reader.take()
            shown.append(_message(reader.extent.id, seq, record))
            await reader.fill()
            if reader.buffer:
                heapq.heappush(heap, (reader.head_key(ranks[reader.extent.id]), i))
        after = _after(cursor, extents, {r.extent.id: r.boundary() for r in readers})
        return json_response(PeekResponse(shown, after.encode() if heap else None))

    async def _start(self, extent: Extent, cursor: Cursor, first: bool) -> int | None:
        """Where the listing takes up ``extent`` (None: done, or left out)."""
        if extent.id in cursor.at:
            return cursor.at[extent.id]
        if cursor.passed(extent) or (cursor.desc and not first):
            return None
        if cursor.desc:
            top = await self._last_seq(extent)
            if cursor.until is not None:
                top = await first_since(self.stores, extent, top, cursor.until + SLACK_MS) - 1
            return top + 1
        if cursor.since is None:
            return 0
        last = await self._last_seq(extent)
        return await first_since(self.stores, extent, last, cursor.since - SLACK_MS) - 1

    async def _last_seq(self, extent: Extent) -> int:
        """A sealed extent's last message; an open one's on every replica that answers."""
        if extent.status not in (OPEN, FAILING) and extent.sealed_seq is not None:
            return extent.sealed_seq
        seqs = []
        for store_id in extent.stores:
            try:
                (info,) = await self.stores.get(store_id).info([extent.id])
            except CheramiError:
                continue
            if info.exists:
                seqs.append(info.last_seq)
        return min(seqs) if seqs else 0


def asked(request: web.Request) -> tuple[Cursor, int, bool]:
    """The cursor to go on from (a new one for a first page), the page's size, and
    whether it is the first page. With a cursor, ``since``, ``until`` and ``order`` are
    the cursor's."""
    query = request.query
    limit = limit_asked(request)
    order = query.get("order", "asc")
    if order not in _ORDERS:
        raise InvalidRequest(f"order must be asc or desc, not {order!r}")
    since = parse_time("since", query["since"]) if "since" in query else None
    until = parse_time("until", query["until"]) if "until" in query else None
    if query.get("cursor"):
        return Cursor.decode(query["cursor"]), limit, False
    return Cursor(order == "desc", since, until), limit, True


def _after(cursor: Cursor, extents: list[Extent], places: dict[str, int | None]) -> Cursor:
    """The cursor of the next page: the extents done from the first on are summed up by
    the floor; every other one's place is kept."""
    following = Cursor(cursor.desc, cursor.since, cursor.until, cursor.floor)
    leading = True
    for extent in extents:  # in the listing's order
        if extent.id in places:
            place = places[extent.id]
        elif extent.id in cursor.at:
            place = cursor.at[extent.id]
        elif cursor.passed(extent) or cursor.desc:
            place = None
        else:
            place = 0
        if leading and place is None:
            following.floor = _key(extent)
            continue
        leading = False
        following.at[extent.id] = place
    return following


def _message(extent: str, seq: int, record: Record) -> PeekMessage:
    text, data = text_or_bytes(record.body, record.text)
    return PeekMessage(
        message_id(extent, seq),
        record.attributes or {},
        rfc3339(record.enqueued_ms),
        text,
        data,
        record.key,
        None if record.expires_ms is None else rfc3339(record.expires_ms),
    )
