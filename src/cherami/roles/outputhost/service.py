"""The output host: serves the deliveries of the consumer groups' extents it holds
(every extent of every group on a single node; the extents it holds leases for in a
cluster, ownership.py), settles them by receipt or stream handle, and persists ack
levels (one metadata write per flush and fence, not per ack)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Protocol

from cherami import timing
from cherami.errors import Fenced, GroupNotFound, QueueNotFound, Unavailable
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import CONSUMED, FAILING, OPEN, SEALED, Fence, Group
from cherami.periodic import Periodic
from cherami.roles.outputhost.deadletterqueue import DeadLetterMover
from cherami.roles.outputhost.entry import Entry
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.receipts import ReceiptSigner
from cherami.roles.outputhost.redelivery import write as write_parked
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire import close

if TYPE_CHECKING:
    from cherami.roles.inputhost.client import InputHostClient

log = logging.getLogger("cherami.outputhost.service")

MOVED_CLOSE = close.RECONFIGURE
DELETED_CLOSE = close.DELETED
NOT_ACTING_WAIT = 0.1  # how often a stream or receive looks again while the group moves

# closes a stream with a code and a reason
Closer = Callable[[int, str], Awaitable[object]]


class Holdings(Protocol):
    """Which groups and extents this output host serves, and whether it may act for
    them now (ownership.py)."""

    def owns(self, queue: str, group: str) -> bool: ...

    def holds(self, queue: str, group: str, extent: str) -> bool: ...

    def acting(self, queue: str, group: str, extent: str) -> bool: ...

    def fence(self, queue: str, group: str, extent: str) -> Fence | None: ...

    def riding_out(self) -> bool: ...


FLUSH_INTERVAL = timing.DEFAULT.ack_flush_interval  # defaults; timing.current is used
REFRESH_INTERVAL = timing.DEFAULT.extent_refresh_interval


class OutputHostService:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        inputs: InputHostClient,
        holdings: Holdings | None = None,
        tag: str = "",
    ) -> None:
        """``holdings`` tells which extents of which groups this output host serves (a
        cluster hands them out by lease) and gives a held extent's fence while this
        host may act for it (None once its lease may have run out: then nothing of the
        extent is delivered, settled or persisted). Without it, it serves every extent
        of every group, unfenced. ``inputs`` takes its moves to dead-letter queues.
        ``tag`` goes into every receipt (the frontend routes
        a settle to the output host that issued the receipt)."""
        self.metadata = metadata
        self._holdings = holdings
        self._streams: dict[str, set[Closer]] = {}
        self.stores = stores
        self.reads = SharedReads(stores)  # one read of a position serves every group
        self.signer = ReceiptSigner(tag=tag)
        self._dead_letter = DeadLetterMover(inputs, metadata)
        self._numbers = itertools.count(1)
        self.groups: dict[str, GroupConsumer] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self._flushed: dict[str, asyncio.Future[dict[str, Exception]]] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._loader: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # a settlement waits for the next flush
        self._unwritten: set[str] = set()  # groups with levels or rows to write
        self._seen = -1  # the metadata change log, as far as the refresh has followed it
        self._again: set[str] = set()  # groups whose refresh failed: read them next time
        self._refresher = Periodic(
            "extent refresh", timing.current.extent_refresh_interval, self._refresh
        )

    def owns(self, queue: str, group: str) -> bool:
        return self._holdings is None or self._holdings.owns(queue, group)

    def holds(self, queue: str, group: str, extent: str) -> bool:
        return self._holdings is None or self._holdings.holds(queue, group, extent)

    def stamp_acting(self, consumer: GroupConsumer) -> bool:
        """Mark each extent cursor of the group acting or not (fencing: this host may
        deliver and settle its messages now); whether any acts."""
        if consumer.stopped:
            return False
        holdings = self._holdings
        if holdings is None:
            return True  # cursors act from the start
        queue, group = consumer.group.queue, consumer.group.name
        some = False
        every = True
        for cursor in consumer.cursors.values():
            acts = cursor.acting = not cursor.fenced and holdings.acting(queue, group, cursor.id)
            some = some or acts
            every = every and acts
        consumer.all_acting = every
        return some

    def check_acting(self, consumer: GroupConsumer, numbers: Iterable[int]) -> None:
        """Raise Unavailable when a delivery named is of an extent this host may not act
        for now (it is moving to another output host)."""
        self.stamp_acting(consumer)
        if consumer.stopped or not consumer.may_settle(numbers):
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
        """Start the background work. A host that serves every group (a node) loads them
        all behind its start, so a node with many groups is up as soon as its roles are;
        a group asked for before its turn (a receive, a stream, its stats) loads then."""
        if self._holdings is None:
            self._loader = asyncio.create_task(self._load_every_group())
        self._flusher = asyncio.create_task(self._flush_loop())
        self._refresher.start()

    async def _load_every_group(self) -> None:
        loaded = 0
        started = time.monotonic()
        for queue in await self.metadata.list_queues():
            for group in await self.metadata.list_groups(queue.name):
                try:
                    await self.group(group.queue, group.name)
                except (GroupNotFound, QueueNotFound):
                    continue  # deleted meanwhile
                except Exception:  # it loads when it is asked for, or at its next change
                    log.exception("group %s/%s could not be loaded", group.queue, group.name)
                    continue
                loaded += 1
        log.info("loaded %d groups in %.1f s", loaded, time.monotonic() - started)

    async def stop(self) -> None:
        if self._loader is not None:
            self._loader.cancel()
            await asyncio.gather(self._loader, return_exceptions=True)
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
            consumer.on_unwritten = partial(self._mark_unwritten, key)
            consumer.start()
            self.groups[key] = consumer
            await self._sync(consumer)
            return consumer

    def _mark_unwritten(self, key: str) -> None:
        self._unwritten.add(key)  # the set of the moment: _flush_once swaps it

    async def _sync(self, consumer: GroupConsumer) -> None:
        """Follow the group's extents (those this host holds): new ones get a cursor,
        after their parked messages are loaded."""
        group = await self.metadata.get_group(consumer.group.queue, consumer.group.name)
        consumer.group = group
        consumer.queue = await self.metadata.get_queue(group.queue)
        levels = {a.extent: a for a in await self.metadata.get_ack_levels(group.queue, group.name)}
        extents = await self.metadata.list_extents(group.queue, (OPEN, FAILING, SEALED, CONSUMED))
        merged = [lv for lv in levels.values() if lv.limit is not None]
        if merged:
            dlq_extents = {e.id: e for e in await self.metadata.list_extents(group.dlq)}
            extents += [dlq_extents[lv.extent] for lv in merged if lv.extent in dlq_extents]
        loaded = consumer.parked.loaded
        fetched = {e.id for e in extents if self.holds(group.queue, group.name, e.id)} - loaded
        rows = await self.metadata.get_redeliveries(group.queue, group.name) if fetched else []
        if consumer.stopped:
            return
        # what it holds now (it may have dropped or taken extents meanwhile); an extent
        # taken since the rows were read waits for the next sync
        held = [
            e for e in extents
            if self.holds(group.queue, group.name, e.id) and (e.id in loaded or e.id in fetched)
        ]  # fmt: skip
        new = {e.id for e in held} - consumer.parked.loaded
        if new:  # their parked messages, before their reads start
            consumer.load_parked([r for r in rows if r.extent in new], new, levels)
        consumer.sync_extents(held, levels)

    async def took(self, queue: str, name: str) -> None:
        """This host took extents of the group: load it, or follow them. Streams of the
        group open here are closed with MOVED_CLOSE: their clients connect again and
        start afresh (credit, handles) with what this host serves now. A stream that
        lived through the move kept the credit of deliveries the move made void, and
        could starve the extents taken back (seen after an 8 s pause of this host)."""
        key = f"{queue}/{name}"
        consumer = self.groups.get(key)
        if consumer is None:
            await self.group(queue, name)
        else:
            await self._sync(consumer)
            await self._close_streams(key, MOVED_CLOSE, "extents moved; reconnect")

    def dropped(self, queue: str, name: str, extent: str) -> None:
        """This host lost an extent of the group (it holds others): what it read of it
        is forgotten here; the new holder delivers it from the persisted ack level."""
        consumer = self.groups.get(f"{queue}/{name}")
        if consumer is not None:
            consumer.drop_extent(extent)

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

    async def _sync_quietly(self, consumer: GroupConsumer) -> bool:
        """Whether the group is in step with the metadata now (or gone)."""
        try:
            await self._sync(consumer)
        except GroupNotFound:
            pass
        except Exception:
            log.exception("group %s: extent refresh failed", consumer.key)
            return False
        return True

    def riding_out(self) -> bool:
        """Whether this host acts through a metadata outage now (outage.py): it leaves
        the store alone until it answers again."""
        return self._holdings is not None and self._holdings.riding_out()

    async def _refresh(self) -> None:
        """Follow what changed since the last refresh (the metadata's change log): the
        groups of the queues written since, and of their dead-letter queues, are read
        again; an idle group costs nothing here. A group whose read failed is read
        again next time; an unknown point in the log reads every group."""
        if self.riding_out():
            return
        latest, changed = await self.metadata.changes_since(self._seen)
        again, self._again = self._again, set()
        for key, consumer in list(self.groups.items()):
            group = consumer.group
            stale = changed is None or group.queue in changed or group.dlq in changed
            if (stale or key in again) and not await self._sync_quietly(consumer):
                self._again.add(key)
        self._seen = latest

    # ack levels
    async def flushed(self, consumer: GroupConsumer, extents: Iterable[str] | None = None) -> None:
        """Wait until every ack of the group made so far is persisted; raises
        Unavailable when the write for one of ``extents`` (None: any) failed, or this
        host may no longer act for it."""
        waiter = self._flushed.get(consumer.key)
        if waiter is None or waiter.done():
            waiter = self._flushed[consumer.key] = asyncio.get_running_loop().create_future()
        self._wake.set()  # a settlement waits: flush now, not at the next interval
        failed = await asyncio.shield(waiter)
        if extents is not None:
            failed = {e: failed[e] for e in extents if e in failed}
        if failed:
            raise next(iter(failed.values()))

    async def _flush_loop(self) -> None:
        """Group commit: a flush starts when a settlement waits for one (at once when
        none is under way; the settlements that arrive during a write share the next
        one) or every ack_flush_interval for the acks nobody waits for (streams)."""
        while True:
            try:
                async with asyncio.timeout(timing.current.ack_flush_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            waiters, self._flushed = self._flushed, {}
            failed = await self._flush_once()
            for key, waiter in waiters.items():
                if not waiter.done():
                    waiter.set_result(failed.get(key, {}))

    async def _flush_once(self) -> dict[str, dict[str, Exception]]:
        """Persist the changed ack levels and parked rows: unfenced groups (one process
        serves every extent) in one write; in a cluster, one write per fence (an
        extent's, or a whole group's). Returns, per group, the extents whose write
        failed or that this host may no longer act for, with the error."""
        failed: dict[str, dict[str, Exception]] = {}
        if self.riding_out():  # written once the store answers again (outage.py)
            return failed
        # only the groups that were told of a change: an idle group costs the flush nothing
        keys, self._unwritten = self._unwritten, set()
        touched = [c for k in keys if (c := self.groups.get(k)) is not None]
        if self._holdings is None:
            unfenced = touched
            err = await self._write_levels(unfenced, None, None)
            if err is not None:
                for consumer in unfenced:
                    failed[consumer.key] = dict.fromkeys(consumer.cursors, err)
            return failed
        writes: list[tuple[GroupConsumer, Fence, set[str]]] = []
        for consumer in touched:
            by_fence: dict[Fence, set[str]] = {}
            queue, group = consumer.group.queue, consumer.group.name
            for extent in consumer.unwritten():
                cursor = consumer.cursors.get(extent)
                fence = self._holdings.fence(queue, group, extent)
                if fence is None or consumer.stopped or (cursor is not None and cursor.fenced):
                    # may not act: keep them for the new holder
                    moving = Unavailable(f"group {consumer.key} is moving; retry")
                    failed.setdefault(consumer.key, {})[extent] = moving
                else:
                    by_fence.setdefault(fence, set()).add(extent)
            writes += [(consumer, fence, extents) for fence, extents in by_fence.items()]
        errors = await asyncio.gather(*(self._write_levels([c], f, e) for c, f, e in writes))
        for (consumer, _, extents), err in zip(writes, errors, strict=True):
            if err is None:
                continue
            failed.setdefault(consumer.key, {}).update(dict.fromkeys(extents, err))
            if isinstance(err, Fenced):  # another host has them now: stop acting for them
                for extent in extents:
                    if (cursor := consumer.cursors.get(extent)) is not None:
                        cursor.fenced, cursor.acting = True, False
        for consumer in touched:  # kept for the new holder, or to write again
            if consumer.unwritten():
                self._unwritten.add(consumer.key)
        return failed

    async def _write_levels(
        self, consumers: list[GroupConsumer], fence: Fence | None, extents: set[str] | None
    ) -> Exception | None:
        """Write the changed levels and parked rows of the groups (of ``extents`` only,
        unless None) in one fence."""
        rows = [row for c in consumers for row in c.dirty_levels(extents)]
        parked = [c.parked for c in consumers if c.parked.pending]
        if not rows and not parked:
            return None
        try:
            # rows before the levels past them
            await write_parked(self.metadata, parked, fence, extents)
            if rows:
                await self.metadata.put_ack_levels(rows, fence=fence)
        except Exception as err:
            for consumer in consumers:  # write them again next time
                for cursor in consumer.cursors.values():
                    if extents is None or cursor.id in extents:
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
            acting = self.stamp_acting(consumer)
            taken = consumer.take(max_messages, visibility) if acting else []
            if taken or consumer.stopped or time.monotonic() >= deadline:
                receipts = self.signer.sign_all(consumer.scope, [e.no for e in taken])
                return list(zip(taken, receipts, strict=True))
            if not acting or consumer.ready:  # moving: nothing it may deliver from here
                await asyncio.sleep(NOT_ACTING_WAIT)
                continue
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
    ) -> tuple[int, list[str], set[str]]:
        """Apply ``action`` (ack, nack, extend) to the deliveries the receipts name.

        Returns how many were applied, the receipts that were stale (not signed by
        this output host for this group in this run, or no longer the current
        delivery) and the extents of the deliveries settled. Raises Unavailable while
        an extent of one of them is moving to another output host."""
        by_number: dict[int, str] = {}
        stale: list[str] = []
        numbers = self.signer.verify_all(consumer.scope, receipts)
        for receipt, no in zip(receipts, numbers, strict=True):
            if no is None or no in by_number:  # not ours, or repeated in this request
                stale.append(receipt)
            else:
                by_number[no] = receipt
        self.check_acting(consumer, by_number)
        extents = {c.id for no in by_number if (c := consumer.cursor_of(no))}
        stale_numbers = action(list(by_number))
        stale.extend(by_number[no] for no in stale_numbers)
        return len(by_number) - len(stale_numbers), stale, extents
