"""What syncing a group with the metadata reads (service.py ``_sync``): the group's and
its queue's records, the group's ack levels, its queue's extents and its dead-letter
queue's. ``OneByOne`` reads them for one group (four or five calls); ``InBulk`` reads
them for every group at once (four statements, whatever the number of groups), for a
refresh that has many groups to sync.

After a cluster's power loss the leader seals and reopens every queue's extents, so the
change log names every queue, tick after tick while it works: the refresh synced each
group of each of them one after another, four or five reads each (1,000 queues x 2
groups: 8,000-10,000 calls a tick through the output host's one event loop, 19% of its
samples during the recovery).

``Named`` reads them for the groups named (a few statements per 500 groups, whatever
the number): the groups of one take of an ownership tick (ownership.py). After a power
loss at 1,000 queues x 2 groups, an output host that took the new units loaded or synced
each group of each take one after another, four to six reads each (about 3,000 each of
``get_ack_levels``, ``list_extents`` and ``get_redeliveries`` in a round). It reads
nothing for a group it knows has no parked message (most groups, after a power loss as
at any time)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from cherami.errors import GroupNotFound, QueueNotFound
from cherami.metadata import models
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import AckLevel, Extent, Group, Queue, Redelivery

# the statuses of the extents a group follows
SYNCED = (models.OPEN, models.FAILING, models.SEALED, models.CONSUMED)
EVERY = (*SYNCED, models.DELETED)  # a dead-letter queue's extents: by id, whatever their status
# stale groups above this many, and above 1/IN_BULK_SHARE of the groups this host knows:
# read in bulk (whose cost grows with every group of the store, not with those stale)
IN_BULK_AFTER = 32
IN_BULK_SHARE = 4
# a take of more groups than this reads theirs together (Named), a few read their own
NAMED_AFTER = 2
Records = tuple[Group, Queue]  # a group's record and its queue's
Key = tuple[str, str]  # a group's queue and name


class SyncRows(Protocol):
    async def records(self, queue: str, name: str) -> Records:
        """The group's record and its queue's; raises GroupNotFound."""
        ...

    async def levels(self, queue: str, name: str) -> list[AckLevel]: ...

    async def extents(self, queue: str, statuses: tuple[str, ...] = SYNCED) -> list[Extent]:
        """The queue's extents in ``statuses``, oldest first."""
        ...

    async def redeliveries(self, queue: str, name: str) -> list[Redelivery]:
        """The group's parked messages, as ``get_redeliveries`` reads them."""
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

    async def redeliveries(self, queue: str, name: str) -> list[Redelivery]:
        return await self.metadata.get_redeliveries(queue, name)


def _by_group(levels: list[AckLevel]) -> dict[Key, list[AckLevel]]:
    by_group: dict[Key, list[AckLevel]] = {}
    for level in levels:
        by_group.setdefault((level.queue, level.group), []).append(level)
    return by_group


class InBulk(OneByOne):
    """Every group's rows, read once (``read``) in the order a group's sync reads them:
    records, ack levels, extents (an extent made after its group's levels were read has
    no level of its own, as in a read one group at a time). A group's parked messages
    are read when its sync asks for them (``redeliveries``), not with the rest: an
    extent the ownership tick takes while the refresh goes on may be among those the
    sync loads, and its previous holder may have parked messages of it after this read."""

    def __init__(
        self,
        metadata: MetadataStore,
        rows: tuple[dict[Key, Group], dict[str, Queue], dict[Key, list[AckLevel]]],
        extents: dict[str, list[Extent]],
    ) -> None:
        super().__init__(metadata)
        self._groups, self._queues, self._levels = rows
        self._extents = extents

    @classmethod
    async def read(cls, metadata: MetadataStore) -> InBulk:
        groups = {(g.queue, g.name): g for g in await metadata.list_every_group()}
        queues = {q.name: q for q in await metadata.list_queues()}
        levels = _by_group(await metadata.list_every_ack_level())
        extents: dict[str, list[Extent]] = {}
        for extent in await metadata.list_extents_in(EVERY):  # oldest first
            extents.setdefault(extent.queue, []).append(extent)
        return cls(metadata, (groups, queues, levels), extents)

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


class Named(OneByOne):
    """The rows of the named groups' loads and syncs (``read``), in the order a group's
    sync reads them, a few statements whatever the number of groups: their records,
    ack levels, their queues' records and extents, the extents of the dead-letter
    queues merged back into some of them, and which have parked messages. What it did
    not read (a group not named, a queue's extents in other statuses) is asked then.

    Read after a take of the ownership tick, for the groups taken. A group named with
    no parked message reads none (``redeliveries``): the extents its sync loads are
    those the tick takes, each unheld when the tick read the leases (before this read),
    so their previous holders had parked what they parked by then (a unit is taken from
    a live holder only once its lease ran out, after that holder stopped acting for it)."""

    def __init__(
        self,
        metadata: MetadataStore,
        rows: tuple[dict[Key, Group], dict[str, Queue], dict[Key, list[AckLevel]]],
        extents: dict[tuple[str, ...], dict[str, list[Extent]]],
        parked: tuple[set[Key], set[Key]],
    ) -> None:
        super().__init__(metadata)
        self._groups, self._queues, self._levels = rows
        self._extents = extents  # by the statuses read, by queue
        self._asked, self._parked = parked  # the groups named, those with parked rows

    @classmethod
    async def read(cls, metadata: MetadataStore, keys: Collection[Key]) -> Named:
        asked = set(keys)
        groups = {(g.queue, g.name): g for g in await metadata.groups_named(asked)}
        levels = _by_group(await metadata.ack_levels_named(asked))
        queues: dict[str, Queue] = {}
        extents: dict[tuple[str, ...], dict[str, list[Extent]]] = {SYNCED: {}, EVERY: {}}
        for queue, rows in await metadata.queues_with_extents({g.queue for g in groups.values()},
                                                              SYNCED):  # fmt: skip
            queues[queue.name], extents[SYNCED][queue.name] = queue, rows
        merged = {groups[k].dlq for k, lvs in levels.items()
                  if k in groups and any(lv.limit is not None for lv in lvs)}  # fmt: skip
        if merged:  # a DLQ's extents whatever their status (merged ranges, by id)
            extents[EVERY] = {q.name: rows for q, rows in
                              await metadata.queues_with_extents(merged, EVERY)}  # fmt: skip
        parked = set(await metadata.groups_with_parked(asked))
        return cls(metadata, (groups, queues, levels), extents, (asked, parked))

    @classmethod
    async def when(cls, keys: Collection[Key], metadata: MetadataStore) -> Named | None:
        """The rows of a take's groups, when there are more than NAMED_AFTER; None:
        each reads its own."""
        return await cls.read(metadata, keys) if len(keys) > NAMED_AFTER else None

    async def records(self, queue: str, name: str) -> Records:
        if (queue, name) not in self._asked:
            return await super().records(queue, name)
        group = self._groups.get((queue, name))
        if group is None:
            raise GroupNotFound(f"no group {name} on queue {queue}")
        record = self._queues.get(group.queue)
        if record is None:
            raise QueueNotFound(f"no queue {queue}")
        return group, record

    async def levels(self, queue: str, name: str) -> list[AckLevel]:
        if (queue, name) not in self._asked:
            return await super().levels(queue, name)
        return list(self._levels.get((queue, name), ()))

    async def extents(self, queue: str, statuses: tuple[str, ...] = SYNCED) -> list[Extent]:
        for read, rows in self._extents.items():
            if statuses and set(statuses) <= set(read) and queue in rows:
                return [e for e in rows[queue] if e.status in statuses]
        return await super().extents(queue, statuses)  # not read (a DLQ with no record)

    async def redeliveries(self, queue: str, name: str) -> list[Redelivery]:
        if (queue, name) in self._asked and (queue, name) not in self._parked:
            return []
        return await super().redeliveries(queue, name)
