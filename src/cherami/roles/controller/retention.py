"""Retention: how space is freed. Open extents that grew old or large are sealed (a new
one takes over), so that whole extents can go; a sealed extent is deleted (its column
family dropped on every replica, no per-message deletes) once every consumer group has
acked all of it (and none of its messages is parked for redelivery) and
``consumed_retention_seconds`` have passed, or once its newest
message is older than ``retention_seconds``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cherami.errors import CheramiError
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import DELETED, OPEN, SEALED, Extent, Queue
from cherami.roles.controller.service import ControllerService
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire.keys import plain_key
from cherami.wire.records import decode_record
from cherami.wire.store import PLAIN, ExtentInfo

log = logging.getLogger("cherami.controller.retention")

MAX_EXTENT_AGE = 3600.0


@dataclass(slots=True)
class _Consumption:
    groups: dict[str, int]  # queue -> how many groups it has
    acked: dict[tuple[str, str], list[int]]  # (queue, extent) -> each group's acked count
    parked: set[tuple[str, str]]  # (queue, extent) holding a parked message


class Retention:
    def __init__(
        self,
        controller: ControllerService,
        metadata: MetadataStore,
        stores: StoreDirectory,
        max_extent_messages: int = 1_000_000,
    ) -> None:
        self.max_extent_messages = max_extent_messages
        self.controller = controller
        self.metadata = metadata
        self.stores = stores
        self._consumed_since: dict[str, float] = {}
        self._newest: dict[str, float] = {}  # a sealed extent's newest enqueue time (s)

    async def tick(
        self,
        queues: Mapping[str, Queue] | None = None,
        opened: list[Extent] | None = None,
        acting: Callable[[], bool] = lambda: True,
    ) -> None:
        """One pass (``queues``: the catalog as the leader knows it, by name, ``opened``:
        the open extents to look at for rolling over; None reads them). Open extents are
        looked at in one info request per store host; only queues with sealed extents
        cost more: nothing here walks every queue. It stops once ``acting`` says the
        leader may no longer act (its lease may have run out: another leads)."""
        if queues is None:
            queues = {q.name: q for q in await self.metadata.list_queues()}

        def kept(name: str) -> Queue | None:  # a DLQ's extents go by merges and purges
            queue = queues.get(name)
            return queue if queue is not None and queue.dlq_of is None else None

        try:
            if opened is None:
                opened = await self.metadata.list_extents_in((OPEN,))
            await self._roll([e for e in opened if kept(e.queue)])
        except CheramiError as err:
            log.warning("retention: rolling extents over: %s", err)
        sealed: dict[str, list[Extent]] = {}
        for extent in await self.metadata.list_extents_in((SEALED, DELETED)):
            if extent.status == DELETED:  # a store host missed its drop: again
                await self.controller.drop_replicas(extent)
                self._consumed_since.pop(extent.id, None)
            elif kept(extent.queue):
                sealed.setdefault(extent.queue, []).append(extent)
        looked_at = {e.id for es in sealed.values() for e in es}  # the others went
        self._consumed_since = {
            e: t for e, t in self._consumed_since.items() if e in looked_at
        }  # fmt: skip
        self._newest = {e: t for e, t in self._newest.items() if e in looked_at}
        if not sealed:
            return
        try:
            consumption = await self._consumption()
            infos = await self.stores.infos([e for es in sealed.values() for e in es])
        except CheramiError as err:
            log.warning("retention: reading what was consumed: %s", err)
            return
        for name, extents in sorted(sealed.items()):
            if not acting():
                log.info("retention: stops, this controller no longer leads")
                return
            try:
                queue = kept(name)
                assert queue is not None
                await self._free(queue, extents, consumption, infos)
            except CheramiError as err:
                log.warning("retention of queue %s: %s", name, err)

    async def _roll(self, extents: list[Extent]) -> None:
        """Seal open extents that are large, or old and not empty (an idle queue's empty
        extent stays: sealing it would free nothing); their successors take over."""
        infos = await self.stores.infos(extents)
        now = time.time()
        for extent in extents:
            info = infos.get(extent.id)
            if info is None:
                continue
            old = now - extent.created_at > MAX_EXTENT_AGE and info.count > 0
            if old or info.count >= self.max_extent_messages:
                log.info(
                    "extent %s of %s rolls over (%d messages)", extent.id, extent.queue, info.count
                )
                await self.controller.replace_extent(extent.id)

    async def _consumption(self) -> _Consumption:
        """Every queue's groups, every group's ack levels and the extents holding parked
        messages: three reads a pass, not three per group of every queue with sealed
        extents (10,000 queues holding a sealed backlog made 25,000 calls a second)."""
        names = {(g.queue, g.name) for g in await self.metadata.list_every_group()}
        groups: dict[str, int] = {}
        for queue, _ in names:
            groups[queue] = groups.get(queue, 0) + 1
        acked: dict[tuple[str, str], list[int]] = {}
        for level in await self.metadata.list_every_ack_level():
            if (level.queue, level.group) in names:
                acked.setdefault((level.queue, level.extent), []).append(level.acked)
        parked = set(await self.metadata.list_every_parked_extent())
        return _Consumption(groups, acked, parked)

    async def _free(
        self, queue: Queue, extents: list[Extent], seen: _Consumption, infos: dict[str, ExtentInfo]
    ) -> None:
        """Delete the queue's sealed ``extents`` that every group consumed or that
        expired."""
        groups = seen.groups.get(queue.name, 0)
        for extent in extents:
            info = infos.get(extent.id)
            if info is None:
                continue
            levels = seen.acked.get((queue.name, extent.id), [])
            consumed = (queue.name, extent.id) not in seen.parked and (
                info.count == 0
                or (groups > 0 and len(levels) == groups and min(levels) >= info.count)
            )
            if consumed:
                since = self._consumed_since.setdefault(extent.id, time.time())
                if time.time() - since >= queue.config.consumed_retention_seconds:
                    await self._delete(queue, extent, "consumed")
            elif await self._expired(queue, extent, info.last_seq):
                await self._delete(queue, extent, "expired")

    async def _expired(self, queue: Queue, extent: Extent, last_seq: int) -> bool:
        """Whether the extent's newest message is older than the queue's retention: its
        enqueue time is read once (a sealed extent's newest message stays its newest),
        not at every pass."""
        if extent.kind != PLAIN or last_seq < 1:
            return False
        newest = self._newest.get(extent.id)
        if newest is None:
            batch = await self.stores.read(extent, plain_key(last_seq - 1), 1)
            if not batch.records:
                return False
            newest = self._newest[extent.id] = decode_record(batch.records[0]).enqueued_ms / 1000
        return time.time() - newest > queue.config.retention_seconds

    async def _delete(self, queue: Queue, extent: Extent, why: str) -> None:
        log.info("extent %s of %s deleted (%s)", extent.id, queue.name, why)
        await self.metadata.set_extent_status(extent.id, DELETED)
        for group in await self.metadata.list_groups(queue.name):
            await self.metadata.delete_ack_levels(queue.name, group.name, [extent.id])
        await self.controller.drop_replicas(extent)
        self._consumed_since.pop(extent.id, None)
