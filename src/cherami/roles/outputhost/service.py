"""The output host: serves every consumer group's deliveries, settles them by receipt or
stream handle, and persists ack levels (one metadata write per flush, not per ack)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

from cherami.errors import GroupNotFound
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import CONSUMED, FAILING, OPEN, SEALED, Group
from cherami.periodic import Periodic
from cherami.roles.outputhost.deadletterqueue import DeadLetterMover, Publish
from cherami.roles.outputhost.entry import Entry
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.receipts import ReceiptSigner
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.roles.storehost.directory import StoreDirectory

log = logging.getLogger("cherami.outputhost.service")

FLUSH_INTERVAL = 0.01
REFRESH_INTERVAL = 1.0


class OutputHostService:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        publish: Publish,
        owns: Callable[[str, str], bool] | None = None,
    ) -> None:
        """``owns`` tells which groups this output host serves (a cluster hands groups
        out by lease); without it, it serves every group."""
        self.metadata = metadata
        self._owns = owns
        self.stores = stores
        self.reads = SharedReads(stores)  # one read of a position serves every group
        self.signer = ReceiptSigner()
        self._dead_letter = DeadLetterMover(publish)
        self._numbers = itertools.count(1)
        self.groups: dict[str, GroupConsumer] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self._flushed: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._refresher = Periodic("extent refresh", REFRESH_INTERVAL, self._refresh)

    def owns(self, queue: str, group: str) -> bool:
        return self._owns is None or self._owns(queue, group)

    async def start(self) -> None:
        if self._owns is None:
            for queue in await self.metadata.list_queues():
                for group in await self.metadata.list_groups(queue.name):
                    await self.group(group.queue, group.name)
        self._flusher = asyncio.create_task(self._flush_loop())
        self._refresher.start()

    async def stop(self) -> None:
        await self._refresher.stop()
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._flush_once()
        for consumer in self.groups.values():
            await consumer.stop()
        self.groups.clear()

    # groups
    async def group(self, queue: str, name: str) -> GroupConsumer:
        key = f"{queue}/{name}"
        consumer = self.groups.get(key)
        if consumer is not None:
            return consumer
        async with self._loading.setdefault(key, asyncio.Lock()):
            consumer = self.groups.get(key)
            if consumer is not None:
                return consumer
            group = await self.metadata.get_group(queue, name)
            queue_record = await self.metadata.get_queue(queue)
            consumer = GroupConsumer(
                queue_record, group, self.reads, self._dead_letter, self._numbers
            )
            consumer.start()
            self.groups[key] = consumer
            await self._sync(consumer)
            return consumer

    async def _sync(self, consumer: GroupConsumer) -> None:
        group = await self.metadata.get_group(consumer.group.queue, consumer.group.name)
        consumer.group = group
        consumer.queue = await self.metadata.get_queue(group.queue)
        levels = {a.extent: a for a in await self.metadata.get_ack_levels(group.queue, group.name)}
        extents = await self.metadata.list_extents(group.queue, (OPEN, FAILING, SEALED, CONSUMED))
        merged = [lv for lv in levels.values() if lv.limit is not None]
        if merged:
            dlq_extents = {e.id: e for e in await self.metadata.list_extents(group.dlq)}
            extents += [dlq_extents[lv.extent] for lv in merged if lv.extent in dlq_extents]
        consumer.sync_extents(extents, levels)

    async def unload(self, queue: str, name: str | None = None) -> None:
        """Forget a deleted group (or every group of a deleted queue)."""
        for key in [k for k, c in self.groups.items() if c.group.queue == queue]:
            if name is None or self.groups[key].group.name == name:
                await self.groups.pop(key).stop()

    def update_group(self, group: Group) -> None:
        consumer = self.groups.get(f"{group.queue}/{group.name}")
        if consumer is not None:
            consumer.group = group

    def extents_changed(self, queue: str) -> None:
        for consumer in list(self.groups.values()):
            if consumer.group.queue == queue or consumer.group.dlq == queue:
                asyncio.create_task(self._sync_quietly(consumer))

    async def _sync_quietly(self, consumer: GroupConsumer) -> None:
        try:
            await self._sync(consumer)
        except GroupNotFound:
            pass
        except Exception:
            log.exception("group %s: extent refresh failed", consumer.key)

    async def _refresh(self) -> None:
        for consumer in list(self.groups.values()):
            await self._sync_quietly(consumer)

    # ack levels
    async def flushed(self) -> None:
        """Wait until every ack made so far is persisted."""
        if self._flushed is None or self._flushed.done():
            self._flushed = asyncio.get_running_loop().create_future()
        waiter = self._flushed
        await asyncio.shield(waiter)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)  # acks gather meanwhile: one write for many
            waiter, self._flushed = self._flushed, None
            try:
                await self._flush_once()
            except Exception as err:
                log.error("ack level flush failed: %s", err)
                if waiter is not None and not waiter.done():
                    waiter.set_exception(err)
                continue
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def _flush_once(self) -> None:
        rows = [row for c in self.groups.values() for row in c.dirty_levels()]
        if rows:
            try:
                await self.metadata.put_ack_levels(rows)
            except Exception:
                for consumer in self.groups.values():  # write them again next time
                    for cursor in consumer.cursors.values():
                        cursor.ack.dirty = True
                raise

    # connectionless receive and settle
    async def receive(
        self, consumer: GroupConsumer, max_messages: int, wait: float, visibility: float | None
    ) -> list[tuple[Entry, str]]:
        deadline = time.monotonic() + wait
        while True:
            taken = consumer.take(max_messages, visibility)
            if taken or time.monotonic() >= deadline:
                return [(e, self.signer.sign(consumer.scope, e.no)) for e in taken]
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    await consumer.readable.wait()
            except TimeoutError:
                pass

    def settle(
        self,
        consumer: GroupConsumer,
        receipts: list[str],
        action: Callable[[list[int]], list[int]],
    ) -> tuple[int, list[str]]:
        """Apply ``action`` (ack, nack, extend) to the deliveries the receipts name.

        Returns how many were applied and the receipts that were stale: not signed by
        this output host for this group in this run, or no longer the current delivery."""
        by_number: dict[int, str] = {}
        stale: list[str] = []
        for receipt in receipts:
            no = self.signer.verify(consumer.scope, receipt)
            if no is None:
                stale.append(receipt)
            else:
                by_number[no] = receipt
        stale_numbers = action(list(by_number))
        stale.extend(by_number[no] for no in stale_numbers)
        return len(by_number) - len(stale_numbers), stale
