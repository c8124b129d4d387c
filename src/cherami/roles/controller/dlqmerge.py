"""A dead-letter queue's cursor: an internal group on the DLQ queue that says how far it
was merged back into its group or purged. Merging and purging move it to the end."""

from __future__ import annotations

from cherami.metadata.base import MetadataStore
from cherami.metadata.models import FAILING, OPEN, SEALED, AckLevel, Extent, Group
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.keys import plain_key

DLQ_CURSOR = "_dlq_cursor"  # internal group on a DLQ queue: how far it was merged or purged


class DlqCursor:
    def __init__(self, metadata: MetadataStore, stores: StoreDirectory) -> None:
        self.metadata = metadata
        self.stores = stores

    async def dlq_cursor(self, dlq: str) -> dict[str, AckLevel]:
        return {a.extent: a for a in await self.metadata.get_ack_levels(dlq, DLQ_CURSOR)}

    async def dlq_ranges(self, dlq: str) -> list[tuple[Extent, AckLevel, int]]:
        """Each DLQ extent with its cursor and last sequence number."""
        cursor = await self.dlq_cursor(dlq)
        ranges = []
        for extent in await self.metadata.list_extents(dlq, (OPEN, FAILING, SEALED)):
            info = await self.stores.info(extent)
            level = cursor.get(extent.id) or AckLevel(queue=dlq, group=DLQ_CURSOR, extent=extent.id)
            ranges.append((extent, level, info.last_seq))
        return ranges

    async def move_dlq_cursor(
        self, dlq: str, merge_into: Group | None, most: int | None = None
    ) -> int:
        """Advance the DLQ cursor to the end (or by ``most`` messages, the oldest
        extents first): purge, or merge the range into one group. Returns how many
        messages it moved."""
        moved = 0
        cursor_rows: list[AckLevel] = []
        merged_rows: list[AckLevel] = []
        group_levels = (
            {
                a.extent: a
                for a in await self.metadata.get_ack_levels(merge_into.queue, merge_into.name)
            }
            if merge_into
            else {}
        )
        for extent, level, last_seq in await self.dlq_ranges(dlq):
            if last_seq <= level.acked:
                continue
            if most is not None:
                if moved >= most:
                    break
                last_seq = min(last_seq, level.acked + most - moved)
            moved += last_seq - level.acked
            end = plain_key(last_seq)
            if merge_into is not None:
                row = group_levels.get(extent.id) or AckLevel(
                    queue=merge_into.queue, group=merge_into.name, extent=extent.id,
                    level=level.level, acked=level.acked,
                )  # fmt: skip
                row.limit = end
                merged_rows.append(row)
            cursor_rows.append(
                AckLevel(queue=dlq, group=DLQ_CURSOR, extent=extent.id, level=end, acked=last_seq)
            )
        if cursor_rows:
            await self.metadata.put_ack_levels(cursor_rows + merged_rows)
        return moved
