"""A queue's scheduled messages: those published with a delay (per message, or the
queue's default delay) that are not due yet, listed in due order and cancelled by id.

Delayed messages live in the queue's timer extents, keyed by (due time, sequence
number), so a page is a merge of each timer extent's records from the page's start on.
A cancel writes a tombstone in the metadata store (``cancel_scheduled``); every group's
reader of the timer extent asks for them when the messages come due and acks the
cancelled ones past, unseen (outputhost/readwindow.py)."""

from __future__ import annotations

import re
import time
from collections import deque

import msgspec
from aiohttp import web

from cherami.errors import AlreadyDue, InvalidRequest, MessageNotFound
from cherami.httpbase import json_response
from cherami.metadata.base import MetadataStore
from cherami.metadata.cancelled import CANCEL_MARGIN_MS
from cherami.metadata.models import DELETED, Extent
from cherami.roles.frontend.context import Lookup
from cherami.roles.frontend.convert import parse_time, rfc3339, text_or_bytes
from cherami.roles.frontend.handlers.peek import read_any
from cherami.roles.frontend.paging import limit_asked
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.keys import MAX_SEQ, seq_of, timer_key
from cherami.wire.records import Record, decode_record, expired, message_id
from cherami.wire.store import TIMER

CHUNK = 500  # records read from a timer extent at a time
_ID = r"[A-Za-z0-9-]{1,64}"
# due ms . extent . seq of the last message shown
CURSOR_PATTERN = rf"^[0-9]{{1,15}}\.{_ID}\.[0-9]{{1,19}}$"
_CURSOR = re.compile(CURSOR_PATTERN)
_MESSAGE_ID = re.compile(rf"^({_ID}):([0-9]{{1,19}})$")


class ScheduledMessage(msgspec.Struct, omit_defaults=True):
    id: str
    due_at: str
    enqueued_at: str
    attributes: dict[str, str]
    body: str | None = None
    body_b64: bytes | None = None  # base64 in JSON
    expires_at: str | None = None


class ScheduledResponse(msgspec.Struct):
    messages: list[ScheduledMessage]
    cursor: str | None  # null: the last page


Place = tuple[int, str, int]  # (due ms, extent id, seq): the listing's order


class _TimerReader:
    """One timer extent's pending messages after a place, a chunk at a time: those not
    cancelled and not expired, due before ``until``."""

    def __init__(
        self, h: ScheduledHandlers, queue: str, extent: Extent, after: bytes, until: int | None
    ) -> None:
        self.h, self.queue, self.extent = h, queue, extent
        self.after = after
        self.until = until
        self.buffer: deque[tuple[Place, Record]] = deque()
        self.done = False

    async def fill(self, now_ms: float) -> None:
        while not self.buffer and not self.done:
            batch = await read_any(self.h.stores, self.extent, self.after, CHUNK)
            if batch is None or not batch.keys:
                self.done = True
                return
            self.after = batch.keys[-1]
            self.done = len(batch.keys) < CHUNK
            seqs = list(map(seq_of, batch.keys))
            gone = await self.h.metadata.cancelled_scheduled(
                self.queue, self.extent.id, min(seqs), max(seqs)
            )
            for key, seq, raw in zip(batch.keys, seqs, batch.records, strict=True):
                due = int.from_bytes(key[:8], "big")
                if self.until is not None and due >= self.until:
                    self.done = True
                    break
                record = decode_record(raw)
                if seq not in gone and not expired(record, now_ms):
                    self.buffer.append(((due, self.extent.id, seq), record))


def _start(extent_id: str, at: Place) -> bytes:
    """The key a timer extent is read after so that only places after ``at`` come."""
    due, extent, seq = at
    if extent_id == extent:
        return timer_key(due, seq)
    return timer_key(due, 0) if extent_id > extent else timer_key(due, MAX_SEQ)


def _cursor_asked(request: web.Request) -> Place | None:
    text = request.query.get("cursor")
    if text is None:
        return None
    if not _CURSOR.fullmatch(text):
        raise InvalidRequest(f"cursor {text!r} is not one a page of scheduled messages gave")
    due, extent, seq = text.split(".")
    return int(due), extent, int(seq)


class ScheduledHandlers:
    def __init__(self, lookup: Lookup, metadata: MetadataStore, stores: StoreDirectory) -> None:
        self.lookup = lookup
        self.metadata = metadata
        self.stores = stores

    async def _timer_extents(self, queue: str) -> list[Extent]:
        extents = await self.metadata.list_extents(queue)
        return [e for e in extents if e.kind == TIMER and e.status != DELETED]

    async def list_scheduled(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "consume")
        limit = limit_asked(request)
        after = _cursor_asked(request)
        query = request.query
        until = parse_time("until", query["until"]) if "until" in query else None
        now_ms = time.time() * 1000
        # not due yet: after every message due now, and after the page before
        at: Place = max(after or (0, "", 0), (int(now_ms), "~", MAX_SEQ))
        readers = [
            _TimerReader(self, queue.name, e, _start(e.id, at), until)
            for e in await self._timer_extents(queue.name)
        ]
        for reader in readers:
            await reader.fill(now_ms)
        shown: list[ScheduledMessage] = []
        last: Place | None = None
        while len(shown) < limit:
            live = [r for r in readers if r.buffer]
            if not live:
                break
            reader = min(live, key=lambda r: r.buffer[0][0])
            last, record = reader.buffer.popleft()
            shown.append(_shown(last, record))
            await reader.fill(now_ms)
        more = last is not None and any(r.buffer for r in readers)
        cursor = f"{last[0]}.{last[1]}.{last[2]}" if more and last is not None else None
        return json_response(ScheduledResponse(shown, cursor))

    async def cancel_scheduled(self, request: web.Request) -> web.Response:
        queue = await self.lookup.queue(request, "produce")
        msg_id = request.match_info["id"]
        match = _MESSAGE_ID.fullmatch(msg_id)
        if match is None:
            raise InvalidRequest(f"{msg_id!r} is not a message id (extent:seq)")
        extent_id, seq = match.group(1), int(match.group(2))
        extent = await self.metadata.get_extent(extent_id)
        if (
            extent is None or extent.queue != queue.name or extent.kind != TIMER
            or extent.status == DELETED
        ):  # fmt: skip
            raise MessageNotFound(f"queue {queue.name} has no delayed message {msg_id}")
        due = await self._due_of(queue.name, extent, seq)
        now_ms = time.time() * 1000
        if due is None:
            raise MessageNotFound(
                f"queue {queue.name} has no delayed message {msg_id} pending (due already, "
                "cancelled, expired, or never published)"
            )
        if due - now_ms < CANCEL_MARGIN_MS:
            raise AlreadyDue(f"message {msg_id} is due at {rfc3339(due)}: too late to cancel")
        await self.metadata.cancel_scheduled(queue.name, extent.id, [seq])
        if time.time() * 1000 > due - CANCEL_MARGIN_MS:  # written too late to be sure
            raise AlreadyDue(f"message {msg_id} came due while it was being cancelled")
        return web.Response(status=204)

    async def _due_of(self, queue: str, extent: Extent, seq: int) -> int | None:
        """The due time of a pending (not due, not cancelled) message of a timer extent
        (None: it has none): its pending records are read until it is found."""
        now_ms = time.time() * 1000
        reader = _TimerReader(self, queue, extent, timer_key(int(now_ms), MAX_SEQ), None)
        while True:
            await reader.fill(now_ms)
            if not reader.buffer:
                return None
            while reader.buffer:
                (due, _, found), _record = reader.buffer.popleft()
                if found == seq:
                    return due


def _shown(at: Place, record: Record) -> ScheduledMessage:
    due, extent, seq = at
    body, body_b64 = text_or_bytes(record.body, record.text)
    expires = record.expires_ms
    return ScheduledMessage(
        message_id(extent, seq), rfc3339(due), rfc3339(record.enqueued_ms),
        record.attributes or {}, body, body_b64,
        None if expires is None else rfc3339(expires),
    )  # fmt: skip
