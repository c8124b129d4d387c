"""Reads of the whole catalog in one statement (``MetadataStore.list_merged_extents``),
shared by the two stores as their cancelled messages are (cancelled.py): what follows
every queue (an output host's ownership tick after a power loss, when the change log
names every queue) reads a table once, not a queue at a time."""

from __future__ import annotations

from cherami.metadata.cancelled import CancelledMessages, Statement

__all__ = ["BulkReads", "Statement"]


class BulkReads(CancelledMessages):
    async def list_merged_extents(self) -> list[tuple[str, str, str]]:
        rows = await self._read_all(
            "SELECT a.queue, a.grp, a.extent FROM ack_levels a "
            "JOIN groups g ON g.queue = a.queue AND g.name = a.grp "
            "JOIN extents e ON e.id = a.extent AND e.queue = g.dlq "
            "WHERE a.lim IS NOT NULL ORDER BY a.queue, a.grp, a.extent",
            (),
        )
        return [(queue, group, extent) for queue, group, extent in rows]
