"""What syncing a group with the metadata reads (service.py ``_sync``): the group's and
its queue's records, the group's ack levels, its queue's extents and its dead-letter
queue's. ``OneByOne`` reads them for one group (four or five calls); ``InBulk`` reads
them for every group at once (four statements, whatever the number of groups), for a
refresh that has many groups to sync.

After a cluster's power loss the leader seals and reopens every queue's extents, so the
change log names every queue, tick after tick while it works: the refresh synced each
group of each of them one after another, four or five reads each (1,000 queues x 2
groups: 8,000-10,000 calls a tick through the output host's one event loop, 19% of its
samples during the recovery)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from cherami.errors import GroupNotFound
from cherami.metadata import models
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import AckLevel, Extent, Group, Queue

# the statuses of the extents a group follows
SYNCED = (models.OPEN, models.FAILING, models.SEALED, models.CONSUMED)
EVERY = (*SYNCED, models.DELETED)  # a dead-letter queue's extents: by id, whatever their status
# stale groups above this many, and above 1/IN_BULK_SHARE of the groups this host knows:
# read in bulk (whose cost grows with every group of the store, not with those stale)
IN_BULK_AFTER = 32
IN_BULK_SHARE = 4
Records = tuple[Group, Queue]  # a group's record and its queue's


class SyncRows(Protocol):
    async def records(self, queue: str, name: str) -> Records:
        """The group's record and its queue's; raises GroupNotFound."""
        ...

    async def levels(self, queue: str, name: str) -> list[AckLevel]: ...

    async def extents(self, queue: str, statuses: tuple[str, ...] = SYNCED) -> list[Extent]:
        """The queue's extents in ``statuses``, oldest first."""
        ...


class OneByOne:
    """Each read asks the metadata store then."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    async def records(self, queue: str, name: str) -> Records:
        group = await self.metadata.get_group(queue, name)
        return group, await self.metadata.get_queue(group.queue)

    async def levels(self, queue: str, name: str) -> list[AckLevel]:
        return await self.metadata.get_ack_levels(queue, name)

    async def extents(self, queue: str, statuses: tuple[str, ...] = SYNCED) -> list[Extent]:
        return await self.metadata.list_extents(queue, statuses)


class InBulk:
    """Every group's rows, read once (``read``) in the order a group's sync reads them:
    records, ack levels, extents (an extent made after its group's levels were read has
    no level of its own, as in a read one group at a time)."""

    def __init__(
        self,
        groups: dict[tuple[str, str], Group],
        queues: dict[str, Queue],
        levels: dict[tuple[str, str], list[AckLevel]],
        extents: dict[str, list[Extent]],
    ) -> None:
        self._groups = groups
        self._queues = queues
        self._levels = levels
        self._extents = extents

    @classmethod
    async def read(cls, metadata: MetadataStore) -> InBulk:
        groups = {(g.queue, g.name): g for g in await metadata.list_every_group()}
        queues = {q.name: q for q in await metadata.list_queues()}
        levels: dict[tuple[str, str], list[AckLevel]] = {}
        for level in await metadata.list_every_ack_level():
            levels.setdefault((level.queue, level.group), []).append(level)
        extents: dict[str, list[Extent]] = {}
        for extent in await metadata.list_extents_in(EVERY):  # oldest first
            extents.setdefault(extent.queue, []).append(extent)
        return cls(groups, queues, levels, extents)

    @classmethod
    async def when(
        cls, stale: Collection[str], loaded: Collection[str], metadata: MetadataStore
    ) -> InBulk | None:
        """Every group's rows for a refresh of the ``stale`` groups (by key) when many
        of those ``loaded`` here are; None: each stale group reads its own."""
        syncs = sum(key in loaded for key in stale)
        if syncs > IN_BULK_AFTER and syncs * IN_BULK_SHARE >= len(loaded):
            return await cls.read(metadata)
        return None

    async def records(self, queue: str, name: str) -> Records:
        group = self._groups.get((queue, name))
        record = self._queues.get(queue)
        if group is None or record is None:
            raise GroupNotFound(f"group {name} of queue {queue} not found")
        return group, record

    async def levels(self, queue: str, name: str) -> list[AckLevel]:
        return list(self._levels.get((queue, name), ()))

    async def extents(self, queue: str, statuses: tuple[str, ...] = SYNCED) -> list[Extent]:
        return [e for e in self._extents.get(queue, ()) if e.status in statuses]
