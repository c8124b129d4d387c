"""Reads of the whole catalog in one statement (``MetadataStore.list_merged_extents``,
``list_every_ack_level``), and of many queues at once (``queues_with_extents``),
shared by the two stores as their cancelled messages are (cancelled.py): what follows
every queue (an output host's ownership tick after a power loss, when the change log
names every queue) reads a table once, not a queue at a time."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from cherami.metadata.cancelled import CancelledMessages, Statement
from cherami.metadata.models import AckLevel, Extent, Group, Queue

__all__ = ["BulkReads", "Statement"]

QUEUE_COLUMNS = "name, config, created_at, dlq_of, timers, keyed"
GROUP_COLUMNS = "queue, name, config, created_at, start_ms, dlq"
EXTENT_COLUMNS = "id, queue, kind, status, input_host, stores, created_at, sealed_seq, predecessor"
NAMES_AT_ONCE = 500  # names a statement asks for (SQLite allows 32,766 parameters)


class BulkReads(CancelledMessages):
    # a row of QUEUE_COLUMNS or EXTENT_COLUMNS as the store returns it, decoded
    _queue_of: Callable[[tuple[Any, ...]], Queue]
    _extent_of: Callable[[tuple[Any, ...]], Extent]
    _group_of: Callable[[tuple[Any, ...]], Group]  # a row of GROUP_COLUMNS

    def _one_of(self, values: list[str]) -> tuple[str, tuple[Any, ...]]:
        """``IN`` the values, as this store's parameters take a list."""
        if self.mark == "%s":  # PostgreSQL: one array parameter, one statement text
            return "= ANY(%s)", (values,)
        return f"IN ({', '.join(self.mark * len(values))})", tuple(values)

    async def queues_with_extents(
        self, names: Collection[str], statuses: tuple[str, ...]
    ) -> list[tuple[Queue, list[Extent]]]:
        found: list[tuple[Queue, list[Extent]]] = []
        ordered = sorted(set(names))
        for at in range(0, len(ordered), NAMES_AT_ONCE):
            chunk = ordered[at : at + NAMES_AT_ONCE]
            named, args = self._one_of(chunk)
            rows = await self._read_all(
                f"SELECT {QUEUE_COLUMNS} FROM queues WHERE name {named} ORDER BY name", args
            )
            queues = [self._queue_of(r) for r in rows]
            extents: dict[str, list[Extent]] = {q.name: [] for q in queues}
            wanted, more = self._one_of(list(statuses))
            rows = await self._read_all(
                f"SELECT {EXTENT_COLUMNS} FROM extents WHERE queue {named} "
                f"AND status {wanted} ORDER BY created_at, id",
                args + more,
            )
            for row in rows:
                extent = self._extent_of(row)
                if extent.queue in extents:  # a queue deleted between the two reads: not
                    extents[extent.queue].append(extent)
            found += [(q, extents[q.name]) for q in queues]
        return found

    async def groups_of(self, names: Collection[str]) -> list[tuple[Group, list[str]]]:
        found: list[tuple[Group, list[str]]] = []
        ordered = sorted(set(names))
        for at in range(0, len(ordered), NAMES_AT_ONCE):
            named, args = self._one_of(ordered[at : at + NAMES_AT_ONCE])
            rows = await self._read_all(
                f"SELECT {GROUP_COLUMNS} FROM groups WHERE queue {named} ORDER BY queue, name",
                args,
            )
            merged: dict[tuple[str, str], list[str]] = {}
            for queue, group, extent in await self._merged(f"AND a.queue {named} ", args):
                merged.setdefault((queue, group), []).append(extent)
            found += [(g, merged.get((g.queue, g.name), [])) for g in map(self._group_of, rows)]
        return found

    async def list_merged_extents(self) -> list[tuple[str, str, str]]:
        return await self._merged("", ())

    async def _merged(self, where: str, args: tuple[Any, ...]) -> list[tuple[str, str, str]]:
        rows = await self._read_all(
            "SELECT a.queue, a.grp, a.extent FROM ack_levels a "
            "JOIN groups g ON g.queue = a.queue AND g.name = a.grp "
            "JOIN extents e ON e.id = a.extent AND e.queue = g.dlq "
            f"WHERE a.lim IS NOT NULL {where}ORDER BY a.queue, a.grp, a.extent",
            args,
        )
        return [(queue, group, extent) for queue, group, extent in rows]

    async def list_every_ack_level(self) -> list[AckLevel]:
        rows = await self._read_all(
            "SELECT queue, grp, extent, level, acked, lim FROM ack_levels "
            "ORDER BY queue, grp, extent",
            (),
        )
        return [
            AckLevel(queue=queue, group=group, extent=extent, level=bytes(level), acked=acked,
                     limit=None if limit is None else bytes(limit))
            for queue, group, extent, level, acked, limit in rows
        ]  # fmt: skip

    async def list_every_parked_extent(self) -> list[tuple[str, str]]:
        rows = await self._read_all(
            "SELECT DISTINCT queue, extent FROM redeliveries ORDER BY queue, extent", ()
        )
        return [(queue, extent) for queue, extent in rows]
