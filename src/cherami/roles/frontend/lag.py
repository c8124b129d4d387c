"""The lag of a stream-mode consumer group: how far its committed offsets (its ack
levels) are behind the queue's plain extents, in messages and in seconds (the age of the
oldest message it has not read). A stream-mode reader such as a Spark query keeps its
own position and commits it; the lag shows an operator a reader falling behind."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from cherami.errors import CheramiError
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import FAILING, OPEN, SEALED, STREAM, Extent, Group
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.keys import plain_key
from cherami.wire.records import decode_record
from cherami.wire.store import PLAIN

log = logging.getLogger("cherami.frontend.lag")


@dataclass(frozen=True, slots=True)
class Lag:
    messages: int  # published to the plain extents, not yet committed by the group
    seconds: float  # how long the oldest of them has waited (0: none)

    def json(self) -> dict[str, float | int]:
        return {"messages": self.messages, "seconds": round(self.seconds, 3)}


async def stream_lag(
    metadata: MetadataStore, stores: StoreDirectory, group: Group, now_ms: int | None = None
) -> Lag:
    """The lag of ``group`` now; extents no replica answers for are left out."""
    levels = {a.extent: a.acked for a in await metadata.get_ack_levels(group.queue, group.name)}
    messages, oldest_ms = 0, None
    for extent in await metadata.list_extents(group.queue, (OPEN, FAILING, SEALED)):
        if extent.kind != PLAIN:
            continue
        acked = levels.get(extent.id, 0)
        try:
            last = await _last_seq(stores, extent)
            if last <= acked:
                continue
            enqueued_ms = await _enqueued_ms(stores, extent, acked + 1)
        except CheramiError as err:
            log.warning("lag of group %s on %s: extent %s: %s", group.name, group.queue,
                        extent.id, err)  # fmt: skip
            continue
        messages += last - acked
        if enqueued_ms is not None:
            oldest_ms = enqueued_ms if oldest_ms is None else min(oldest_ms, enqueued_ms)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    seconds = max(0, now_ms - oldest_ms) / 1000 if oldest_ms is not None else 0.0
    return Lag(messages, seconds)


async def stream_lags(metadata: MetadataStore, stores: StoreDirectory) -> list[tuple[Group, Lag]]:
    """The lag of every stream-mode group of every queue (for the metrics): the groups
    in one read, then only the stream-mode ones cost more."""
    streams = [g for g in await metadata.list_every_group() if g.config.type == STREAM]
    return [(group, await stream_lag(metadata, stores, group)) for group in streams]


async def _last_seq(stores: StoreDirectory, extent: Extent) -> int:
    if extent.status == SEALED and extent.sealed_seq is not None:
        return extent.sealed_seq
    return (await stores.info(extent)).last_seq


async def _enqueued_ms(stores: StoreDirectory, extent: Extent, seq: int) -> int | None:
    batch = await stores.read(extent, plain_key(seq - 1) if seq > 1 else b"", 1)
    return decode_record(batch.records[0]).enqueued_ms if batch.records else None
