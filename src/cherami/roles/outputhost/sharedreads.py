"""Reads of plain extents shared by every consumer group of an output host.

Every group gets every message, so with several groups tailing a queue they read the
same records at about the same time. A read of a plain extent at a position is made
once: a group asking for the position while the read is under way waits for that read,
and a group asking shortly after is answered from the few chunks kept from recent reads.
The records are decoded once and their message ids made once; each group still tracks
its own entries. Timer extents are read per group (each group has its own delay).

Only committed records are ever read (a store host keeps readers behind the point every
replica holds), and those never change, so a kept chunk stays true; empty reads and the
end of a sealed extent are never kept, so each group still sees the end from two
replicas itself."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass

import msgspec

from cherami.errors import ProtocolError
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.keys import seq_of
from cherami.wire.records import (
    Record,
    decode_record_array,
    decode_records,
    message_id,
    message_ids,
)
from cherami.wire.store import ReadResult

KEEP_BYTES = 8 << 20  # record bytes kept from recent reads, over every extent
SHORT_BYTES = 1 << 19  # a read's answer under this size was not cut by the store's 1 MiB


@dataclass(frozen=True, slots=True)
class Chunk:
    """Records read after a position: their keys, decoded records and message ids."""

    store_id: str
    keys: list[bytes]
    records: list[Record]
    ids: list[str]
    end: bool
    size: int
    # when the read was sent, if it came back with fewer records than it asked for: every
    # record committed before then is in it (epoch ms; 0: a full read, or not known)
    asked_ms: float = 0.0


class SharedReads:
    def __init__(self, stores: StoreDirectory, keep_bytes: int = KEEP_BYTES) -> None:
        self.stores = stores
        self._keep_bytes = keep_bytes
        self._kept_bytes = 0
        self._kept: OrderedDict[tuple[str, bytes], Chunk] = OrderedDict()
        self._reading: dict[tuple[str, bytes], asyncio.Future[Chunk]] = {}
        self.store_reads = 0  # reads sent to store hosts (the rest were shared)

    async def read(
        self, store_id: str, extent: str, after: bytes, max_count: int, wait_ms: int
    ) -> Chunk:
        """Records of plain ``extent`` after ``after``, from ``store_id`` unless another
        group's read of the same position is under way or was made a moment ago."""
        at = (extent, after)
        while True:
            kept = self._kept.get(at)
            if kept is not None:
                self._kept.move_to_end(at)
                return kept
            reading = self._reading.get(at)
            if reading is None:
                return await self._read(at, store_id, max_count, wait_ms)
            try:
                return await asyncio.shield(reading)
            except _ReadFailed:
                continue  # that read failed or its group stopped: read for ourselves

    async def _read(
        self, at: tuple[str, bytes], store_id: str, max_count: int, wait_ms: int
    ) -> Chunk:
        future: asyncio.Future[Chunk] = asyncio.get_running_loop().create_future()
        self._reading[at] = future
        try:
            self.store_reads += 1
            store = self.stores.get(store_id)
            asked = time.time() * 1000
            batch = await store.read(at[0], at[1], max_count, wait_ms=wait_ms, joined=True)
            # short: fewer records than asked, and not for the store's byte cap per read
            size = len(batch.joined) if batch.joined is not None else sum(map(len, batch.records))
            short = len(batch.keys) < max_count and size < SHORT_BYTES
            chunk = decode_chunk(store_id, at[0], batch, False, asked if short else 0.0)
        except BaseException:
            # a group waiting for this read tries its own replica instead of taking on
            # another group's failure (or its cancellation)
            future.set_exception(_ReadFailed())
            future.exception()  # nobody waiting is fine too
            raise
        finally:
            del self._reading[at]
        if chunk.keys and not chunk.end:
            self._keep(at, chunk)
        future.set_result(chunk)
        return chunk

    def _keep(self, at: tuple[str, bytes], chunk: Chunk) -> None:
        self._kept[at] = chunk
        self._kept_bytes += chunk.size
        while self._kept_bytes > self._keep_bytes and self._kept:
            _, old = self._kept.popitem(last=False)
            self._kept_bytes -= old.size


class _ReadFailed(Exception):
    """The read another group waited for failed or was cancelled with its group."""


def decode_chunk(
    store_id: str, extent: str, batch: ReadResult, timer: bool, asked_ms: float = 0.0
) -> Chunk:
    """Plain extents hand out dense sequence numbers, so their ids are counted, not
    parsed; timer extent keys are (due time, sequence number)."""
    keys = batch.keys
    if timer:
        ids = [message_id(extent, seq_of(key)) for key in keys]
    else:
        ids = message_ids(extent, seq_of(keys[0]) if keys else 0, len(keys))
    if batch.joined is not None:  # one call for every record (a joined read)
        try:
            records = decode_record_array(batch.joined)
        except msgspec.DecodeError as err:
            raise ProtocolError(f"a joined read's records do not decode: {err}") from None
        if len(records) != len(keys):
            raise ProtocolError(f"a read of {len(keys)} keys brought {len(records)} records")
        size = len(batch.joined)
    else:
        records = decode_records(batch.records)
        size = sum(map(len, batch.records))
    return Chunk(store_id, keys, records, ids, batch.end, size, asked_ms)
