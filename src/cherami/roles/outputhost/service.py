"""The output host: serves every consumer group's deliveries, settles them by receipt or
stream handle, and persists ack levels (one metadata write per flush, not per ack)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from cherami.errors import Fenced, GroupNotFound, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import CONSUMED, FAILING, OPEN, SEALED, Fence, Group
from cherami.periodic import Periodic
from cherami.roles.outputhost.deadletterqueue import DeadLetterMover, Publish
from cherami.roles.outputhost.entry import Entry
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.receipts import ReceiptSigner
from cherami.roles.outputhost.redelivery import write as write_parked
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire import close

log = logging.getLogger("cherami.outputhost.service")

MOVED_CLOSE = close.RECONFIGURE
DELETED_CLOSE = close.DELETED
NOT_ACTING_WAIT = 0.1  # how often a stream or receive looks again while the group moves

# closes a stream with a code and a reason
Closer = Callable[[int, str], Awaitable[object]]

FLUSH_INTERVAL = 0.01
REFRESH_INTERVAL = 1.0


class OutputHostService:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        publish: Publish,
        owns: Callable[[str, str], bool] | None = None,
        fence: Callable[[str, str], Fence | None] | None = None,
    ) -> None:
        """``owns`` tells which groups this output host serves (a cluster hands groups
        out by lease); without it, it serves every group. ``fence`` gives a held
        group's fence while this host may act for it, and None once its lease may have
        run out (ownership.py): then nothing is delivered, settled or persisted."""
        self.metadata = metadata
        self._owns = owns
        self._fence = fence
        self._streams: dict[str, set[Closer]] = {}
        self.stores = stores
        self.reads = SharedReads(stores)  # one read of a position serves every group
        self.signer = ReceiptSigner()
        self._dead_letter = DeadLetterMover(publish)
        self._numbers = itertools.count(1)
        self.groups: dict[str, GroupConsumer] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self._flushed: dict[str, asyncio.Future[None]] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._refresher = Periodic("extent refresh", REFRESH_INTERVAL, self._refresh)

    def owns(self, queue: str, group: str) -> bool:
        return self._owns is None or self._owns(queue, group)

    def fence_of(self, consumer: GroupConsumer) -> Fence | None:
        return self._fence(consumer.group.queue, consumer.group.name) if self._fence else None

    def acting(self, consumer: GroupConsumer) -> bool:
        """Whether this host may deliver and settle for the group now (fencing)."""
        return not consumer.stopped and (self._fence is None or self.fence_of(consumer) is not None)

    def check_acting(self, consumer: GroupConsumer) -> None:
        if not self.acting(consumer):
            raise Unavailable(f"group {consumer.key} is moving to another output host; retry")

    # streams
    def attach(self, consumer: GroupConsumer, closer: Closer) -> Callable[[], None]:
        """Register an open consume stream of the group; unloading the group closes it.
        Returns the function that unregisters it."""
        streams = self._streams.setdefault(consumer.key, set())
        streams.add(closer)
        return lambda: streams.discard(closer)

    async def _close_streams(self, key: str, code: int, reason: str) -> None:
        closers = self._streams.pop(key, set())
        if closers:
            log.info("group %s: closing %d streams (%d %s)", key, len(closers), code, reason)
        await asyncio.gather(*(c(code, reason) for c in closers), return_exceptions=True)

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
        try:
            await self._flush_once()
        except Exception as err:
            log.error("last ack level flush failed: %s", err)
        for key, consumer in self.groups.items():
            await self._close_streams(key, close.GOING_AWAY, "server stopping")
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
        if not consumer.parked.loaded:  # its parked messages, before its reads start
            rows = await self.metadata.get_redeliveries(group.queue, group.name)
            consumer.load_parked(rows, levels)
        consumer.sync_extents(extents, levels)

    async def unload(
        self, queue: str, name: str | None = None, close_code: int = DELETED_CLOSE
    ) -> None:
        """Forget a group (or every group of a queue): it was deleted (its streams are
        closed with DELETED_CLOSE) or it moved to another output host (MOVED_CLOSE)."""
        reason = "deleted" if close_code == DELETED_CLOSE else "group moved; reconnect"
        for key in [k for k, c in self.groups.items() if c.group.queue == queue]:
            if name is None or self.groups[key].group.name == name:
                consumer = self.groups.pop(key)
                consumer.stopped = True  # nothing more is delivered or settled here
                await self._close_streams(key, close_code, reason)
                await consumer.stop()

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
    async def flushed(self, consumer: GroupConsumer) -> None:
        """Wait until every ack of the group made so far is persisted; raises
        Unavailable when that write failed (or this host may no longer act for it)."""
        waiter = self._flushed.get(consumer.key)
        if waiter is None or waiter.done():
            waiter = self._flushed[consumer.key] = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)  # acks gather meanwhile: one write for many
            waiters, self._flushed = self._flushed, {}
            failed = await self._flush_once()
            for key, waiter in waiters.items():
                if waiter.done():
                    continue
                if key in failed:
                    waiter.set_exception(failed[key])
                else:
                    waiter.set_result(None)

    async def _flush_once(self) -> dict[str, Exception]:
        """Persist every group's changed ack levels: unfenced groups (one process serves
        every group) in one write, each fenced group in its own write with its fence.
        Returns the groups whose write failed, with the error."""
        failed: dict[str, Exception] = {}
        unfenced: list[GroupConsumer] = []
        for consumer in list(self.groups.values()):
            if self._fence is None:
                unfenced.append(consumer)
                continue
            fence = self.fence_of(consumer)
            if fence is None or consumer.stopped:  # may not act: keep them for the new owner
                failed[consumer.key] = Unavailable(f"group {consumer.key} is moving; retry")
                continue
            err = await self._write_levels([consumer], fence)
            if err is not None:
                failed[consumer.key] = err
                if isinstance(err, Fenced):  # another host has it now
                    consumer.stopped = True
        if unfenced:
            err = await self._write_levels(unfenced, None)
            if err is not None:
                failed.update((c.key, err) for c in unfenced)
        return failed

    async def _write_levels(
        self, consumers: list[GroupConsumer], fence: Fence | None
    ) -> Exception | None:
        rows = [row for c in consumers for row in c.dirty_levels()]
        parked = [c.parked for c in consumers if c.parked.pending]
        if not rows and not parked:
            return None
        try:
            await write_parked(self.metadata, parked, fence)  # rows before the levels past them
            if rows:
                await self.metadata.put_ack_levels(rows, fence=fence)
        except Exception as err:
            for consumer in consumers:  # write them again next time
                for cursor in consumer.cursors.values():
                    cursor.ack.dirty = True
            log.error("ack level flush failed: %s", err)
            if isinstance(err, Unavailable):
                return err
            return Unavailable(f"ack levels could not be written: {err}")
        return None

    # connectionless receive and settle
    async def receive(
        self, consumer: GroupConsumer, max_messages: int, wait: float, visibility: float | None
    ) -> list[tuple[Entry, str]]:
        deadline = time.monotonic() + wait
        while True:
            if not self.acting(consumer):  # moving: deliver nothing from here
                if consumer.stopped or time.monotonic() >= deadline:
                    return []
                await asyncio.sleep(NOT_ACTING_WAIT)
                continue
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
        this output host for this group in this run, or no longer the current delivery.
        Raises Unavailable while the group is moving to another output host."""
        self.check_acting(consumer)
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
