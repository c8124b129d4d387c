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
from typing import TYPE_CHECKING

from cherami.context import DEFAULT, ProcessContext
from cherami.errors import GroupNotFound, QueueNotFound, Unavailable
from cherami.loadmeter import Activity
from cherami.metadata.base import MetadataStore
from cherami.metadata.models import Group, Queue
from cherami.periodic import Periodic
from cherami.roles.outputhost.cancels import CancelCache
from cherami.roles.outputhost.catalog import WHOLE
from cherami.roles.outputhost.committer import AckCommitter, Holdings
from cherami.roles.outputhost.deadletterqueue import DeadLetterMover
from cherami.roles.outputhost.entry import Entry
from cherami.roles.outputhost.groupconsumer import GroupConsumer
from cherami.roles.outputhost.idlegroups import Unloaded, forget_merged, may_unload
from cherami.roles.outputhost.receipts import ReceiptSigner
from cherami.roles.outputhost.sharedreads import SharedReads
from cherami.roles.outputhost.syncrows import EVERY, InBulk, OneByOne, Records, SyncRows
from cherami.roles.storehost.directory import StoreDirectory
from cherami.wire import close
from cherami.wire.store import TIMER

if TYPE_CHECKING:
    from cherami.roles.inputhost.client import InputHostClient

log = logging.getLogger("cherami.outputhost.service")

MOVED_CLOSE = close.RECONFIGURE
DELETED_CLOSE = close.DELETED
NOT_ACTING_WAIT = 0.1  # how often a stream or receive looks again while the group moves
KEYED_REFRESH = 0.05  # a keyed message waiting for the extents to be known: refresh then

# closes a stream with a code and a reason
Closer = Callable[[int, str], Awaitable[object]]


__all__ = ["Holdings", "OutputHostService"]


class OutputHostService:
    def __init__(
        self,
        metadata: MetadataStore,
        stores: StoreDirectory,
        inputs: InputHostClient,
        holdings: Callable[[OutputHostService], Holdings] | None = None,
        tag: str = "",
        ctx: ProcessContext = DEFAULT,
    ) -> None:
        """``holdings`` makes, given this service (which it tells of the units it takes
        and drops), what tells which extents of which groups this output host serves (a
        cluster hands them out by lease) and gives a held extent's fence while this
        host may act for it (None once its lease may have run out: then nothing of the
        extent is delivered, settled or persisted). Without it, it serves every extent
        of every group, unfenced. ``inputs`` takes its moves to dead-letter queues.
        ``tag`` goes into every receipt (the frontend routes
        a settle to the output host that issued the receipt). ``ctx``: the process's
        timing, clock and key (context.py)."""
        self.metadata = metadata
        self.ctx = ctx
        self._holdings = None if holdings is None else holdings(self)
        self._streams: dict[str, set[Closer]] = {}
        self.stores = stores
        self.reads = SharedReads(stores)  # one read of a position serves every group
        self.signer = ReceiptSigner(tag=tag)
        self._dead_letter = DeadLetterMover(inputs, metadata)
        self._numbers = itertools.count(1)
        self.groups: dict[str, GroupConsumer] = {}
        self._named: dict[str, set[str]] = {}  # a queue's or a DLQ's name -> its groups' keys
        self._loading: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # and how many wait
        # a node loads a group when asked for, unloads it when left alone (idlegroups.py)
        self.lazy = holdings is None and ctx.timing.group_idle_unload > 0
        self.unloaded: dict[str, Unloaded] = {}  # what is kept of those not loaded, by key
        self._idle_after = idle = ctx.timing.group_idle_unload
        self._sweeper = Periodic("idle group unload", max(0.5, idle / 4), self.unload_idle)
        self._loader: asyncio.Task[None] | None = None
        self.activity = Activity()  # the cursors that delivered (load reports)
        self.committer = AckCommitter(
            metadata, self.groups, self._holdings, self.riding_out, ctx.timing.ack_flush_interval
        )
        self._seen = -1  # the metadata change log, as far as the refresh has followed it
        self._again: set[str] = set()  # groups whose refresh failed: read them next time
        # every extent made before this time (epoch ms) is known to every group not in
        # _again (the start of the last refresh); groups with keyed messages waiting on it
        self.extents_known_ms = 0.0
        self._cancels = CancelCache(metadata)
        self._keyed_pending: set[str] = set()
        self._refreshing = asyncio.Lock()
        self._soon: asyncio.Task[None] | None = None  # a refresh for keyed messages
        self._marking: set[asyncio.Task[None]] = set()  # queues being marked keyed
        self._refresher = Periodic(
            "extent refresh", ctx.timing.extent_refresh_interval, self._refresh
        )

    def owns(self, queue: str, group: str) -> bool:
        return self._holdings is None or self._holdings.owns(queue, group)

    def holds(self, queue: str, group: str, extent: str) -> bool:
        return self._holdings is None or self._holdings.holds(queue, group, extent)

    def _acts(self, queue: str, group: str, extent: str) -> bool:
        assert self._holdings is not None
        return self._holdings.acting(queue, group, extent)

    def check_acting(self, consumer: GroupConsumer, numbers: Iterable[int]) -> None:
        """Raise Unavailable when a delivery named is of an extent this host may not act
        for now (it is moving to another output host)."""
        if not consumer.may_settle(numbers):
            raise Unavailable(f"group {consumer.key} is moving to another output host; retry")

    # streams
    def attach(self, consumer: GroupConsumer, closer: Closer) -> Callable[[], None]:
        """Register an open consume stream of the group; unloading the group closes it.
        Returns the function that unregisters it."""
        streams = self._streams.setdefault(consumer.key, set())
        streams.add(closer)

        def detach() -> None:
            streams.discard(closer)
            consumer.used_at = self.ctx.clock()  # left alone from now

        return detach

    async def _close_streams(self, key: str, code: int, reason: str) -> None:
        closers = self._streams.pop(key, set())
        if closers:
            log.info("group %s: closing %d streams (%d %s)", key, len(closers), code, reason)
        await asyncio.gather(*(c(code, reason) for c in closers), return_exceptions=True)

    async def start(self) -> None:
        """Start the background work. A host that serves every group (a node) loads them
        (those with parked messages, unless it keeps every group loaded) behind its
        start, so a node with many groups is up as soon as its roles are; a group asked
        for before its turn (a receive, a stream) loads then."""
        if self._holdings is None:
            self._loader = asyncio.create_task(self._load_every_group())
        self.committer.start()
        self._refresher.start()
        if self.lazy:
            self._sweeper.start()

    async def _load_every_group(self) -> None:
        loaded = 0
        started = time.monotonic()
        for group in await self.metadata.list_every_group():  # one read, not one a queue
            if group.name.startswith("_"):
                continue  # internal (a DLQ's cursor, which no name a client gives can be)
            try:
                if self.lazy and not await self.metadata.get_redeliveries(group.queue, group.name):
                    continue  # nothing parked: it loads when it is asked for
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
        await self._sweeper.stop()
        if self._soon is not None:
            self._soon.cancel()
        await self.committer.stop()
        for key, consumer in self.groups.items():
            await self._close_streams(key, close.GOING_AWAY, "server stopping")
            await consumer.stop()
        self.groups.clear()

    # groups
    async def group(self, queue: str, name: str) -> GroupConsumer:
        key = f"{queue}/{name}"
        consumer = self.groups.get(key)
        if consumer is not None:
            consumer.used_at = self.ctx.clock()
            return consumer
        lock, waiting = self._loading.setdefault(key, (asyncio.Lock(), [0]))
        waiting[0] += 1
        try:
            async with lock:
                return await self._load(key, queue, name)
        finally:
            waiting[0] -= 1
            if not waiting[0]:  # no lock left behind a group: a node may hold many
                del self._loading[key]

    async def _load(self, key: str, queue: str, name: str) -> GroupConsumer:
        consumer = self.groups.get(key)
        if consumer is not None:
            return consumer
        group = await self.metadata.get_group(queue, name)
        queue_record = await self.metadata.get_queue(queue)
        acts = None if self._holdings is None else partial(self._acts, queue, name)
        consumer = GroupConsumer(
            queue_record, group, self.reads, self._dead_letter, self._numbers, acts, self.ctx
        )
        consumer.on_unwritten = partial(self.committer.mark, key)
        consumer.window.cancelled_of = partial(self._cancels.of, queue)
        consumer.keys.known_ms = partial(self._known_ms, key)
        consumer.keys.on_pending = partial(self._keyed_waiting, key)
        if self._holdings is not None:  # a cluster: keyed messages only from WHOLE
            consumer.keys.whole = partial(self._holdings.holds, queue, name, WHOLE)
        consumer.flight.activity = self.activity
        if (kept := self.unloaded.pop(key, None)) is not None:
            kept.restore(consumer)
        consumer.start()
        self.groups[key] = consumer
        self.follow(key, group)
        await self._sync(consumer, (group, queue_record))
        return consumer

    async def _sync(
        self, consumer: GroupConsumer, read: Records | None = None, reads: SyncRows | None = None
    ) -> None:
        """Follow the group's extents (those this host holds): new ones get a cursor,
        after their parked messages are loaded. ``read``: the group's and its queue's
        records, read just now (a group being loaded); ``reads``: syncrows.py."""
        reads = reads or OneByOne(self.metadata)
        if read is None:
            read = await reads.records(consumer.group.queue, consumer.group.name)
        group = read[0]
        consumer.configure(read[1], group)
        levels = {a.extent: a for a in await reads.levels(group.queue, group.name)}
        extents = await reads.extents(group.queue)
        merged = [lv for lv in levels.values() if lv.limit is not None]
        if merged:
            dlq_extents = {e.id: e for e in await reads.extents(group.dlq, EVERY)}
            extents += [dlq_extents[lv.extent] for lv in merged if lv.extent in dlq_extents]
        loaded = consumer.parked.loaded
        fetched = {e.id for e in extents if self.holds(group.queue, group.name, e.id)} - loaded
        rows = await self.metadata.get_redeliveries(group.queue, group.name) if fetched else []
        if any(e.kind == TIMER for e in extents):  # its cancels, known before any is due
            await self._cancels.known(group.queue)
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
        for key in sorted(self._named.get(queue, ())):
            consumer = self.groups.get(key)
            group = consumer.group if consumer is not None else self.unloaded[key].group
            if group.queue != queue or (name is not None and group.name != name):
                continue
            self.unloaded.pop(key, None)
            for named in (queue, group.dlq):
                keys = self._named.get(named, set())
                keys.discard(key)
                if not keys:
                    self._named.pop(named, None)
            if consumer is not None:
                await self._drop(consumer, close_code, reason)

    async def _drop(self, consumer: GroupConsumer, close_code: int, reason: str) -> None:
        del self.groups[consumer.key]
        consumer.halt()  # nothing more is delivered or settled here
        await self._close_streams(consumer.key, close_code, reason)
        await consumer.stop()

    def follow(self, key: str, group: Group) -> None:
        """The group (loaded, or kept unloaded) is followed by its queue's and its DLQ's
        names (the refresh, a deletion)."""
        for named in (group.queue, group.dlq):
            self._named.setdefault(named, set()).add(key)

    async def unload_idle(self) -> int:
        """Unload the groups left alone long enough that nothing needs loaded
        (idlegroups.py); how many were."""
        since, unloaded = self.ctx.clock() - self._idle_after, 0
        for key, consumer in list(self.groups.items()):
            streams, busy = bool(self._streams.get(key)), self.committer.busy(key)
            if self.groups.get(key) is consumer and may_unload(consumer, since, streams, busy):
                self.unloaded[key] = Unloaded.of(consumer)  # checked and kept without a pause
                await self._drop(consumer, close.GOING_AWAY, "group unloaded")
                unloaded += 1
        if unloaded:
            log.info("unloaded %d idle groups (%d loaded)", unloaded, len(self.groups))
        return unloaded

    def update_group(self, group: Group) -> None:
        key = f"{group.queue}/{group.name}"
        consumer = self.groups.get(key)
        if consumer is not None:
            consumer.configure(group=group)
        elif (kept := self.unloaded.get(key)) is not None:
            kept.group = group

    def update_queue(self, queue: Queue) -> None:
        for consumer in self.groups.values():
            if consumer.group.queue == queue.name:
                consumer.configure(queue=queue)

    async def _sync_quietly(self, consumer: GroupConsumer, reads: SyncRows | None) -> bool:
        """Whether the group is in step with the metadata now (or gone)."""
        try:
            await self._sync(consumer, reads=reads)
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
        async with self._refreshing:
            await self._refresh_now()

    def _keyed_waiting(self, key: str) -> None:
        """A keyed message of the group waits for the extents to be known as of its
        enqueue time: refresh soon, not only at the next tick (cost follows work)."""
        self._keyed_pending.add(key)
        if self._soon is None or self._soon.done():
            self._soon = asyncio.create_task(self._refresh_soon())
        consumer = self.groups.get(key)
        if consumer is not None and not consumer.queue.keyed and not consumer.keys.whole():
            consumer.queue.keyed = True  # asked once
            task = asyncio.create_task(self._mark_keyed(consumer.queue.name))
            self._marking.add(task)
            task.add_done_callback(self._marking.discard)

    async def _mark_keyed(self, queue: str) -> None:
        """A keyed message in a group whose extents are held one by one, of a queue not
        marked keyed (written before input hosts marked queues): mark it, so that its
        groups are served whole and their keyed messages go on."""
        try:
            await self.metadata.mark_queue(queue, "keyed")
        except Exception as err:  # the next keyed message that waits asks again
            log.warning("queue %s not marked keyed: %s", queue, err)
            for consumer in self.groups.values():
                if consumer.group.queue == queue:
                    consumer.queue.keyed = False

    async def _refresh_soon(self) -> None:
        await asyncio.sleep(KEYED_REFRESH)  # what a burst of reads brings, together
        try:
            await self._refresh()
        except Exception as err:  # the tick tries again
            log.warning("extent refresh for keyed messages failed: %s", err)

    async def _refresh_now(self) -> None:
        if self.riding_out():
            return
        started = time.time() * 1000
        latest, changed = await self.metadata.changes_since(self._seen)
        again, self._again = self._again, set()
        await self._cancels.follow(changed, started)
        if changed is not None and not changed and not again:
            self._seen = latest
            self._extents_known(started)
            return  # nothing written since: no group to look at (not a walk over them all)
        stale = (
            set(self.groups)
            if changed is None
            else again.union(*(self._named.get(name, ()) for name in changed))
        )  # the groups of the queues and DLQs written since: not a walk over them all
        await forget_merged(
            self.metadata, self.unloaded, self.unloaded if changed is None else stale
        )
        reads = await InBulk.when(stale, self.groups, self.metadata)
        for key in sorted(stale):
            consumer = self.groups.get(key)
            if consumer is not None and not await self._sync_quietly(consumer, reads):
                self._again.add(key)
        self._seen = latest
        self._extents_known(started)

    def _extents_known(self, at_ms: float) -> None:
        """A refresh that began at ``at_ms`` is done: keyed messages enqueued before
        then that waited for it may go on (keygate.py, "Across extents")."""
        self.extents_known_ms = at_ms
        for key in list(self._keyed_pending):
            consumer = self.groups.get(key)
            if consumer is not None and consumer.keys.pending:
                consumer.keys.read()
            if consumer is None or not consumer.keys.pending:
                self._keyed_pending.discard(key)

    def _known_ms(self, key: str) -> float:
        return 0.0 if key in self._again else self.extents_known_ms

    # ack levels
    async def flushed(self, consumer: GroupConsumer, extents: Iterable[str] | None = None) -> None:
        """Wait until every ack of the group made so far is persisted (committer.py)."""
        await self.committer.flushed(consumer, extents)

    # connectionless receive and settle
    async def receive(
        self, consumer: GroupConsumer, max_messages: int, wait: float, visibility: float | None
    ) -> list[tuple[Entry, str]]:
        consumer.users += 1  # not unloaded while it waits
        try:
            return await self._receive(consumer, max_messages, wait, visibility)
        finally:
            consumer.users -= 1
            consumer.used_at = self.ctx.clock()

    async def _receive(
        self, consumer: GroupConsumer, max_messages: int, wait: float, visibility: float | None
    ) -> list[tuple[Entry, str]]:
        deadline = time.monotonic() + wait
        while True:
            acting = consumer.acts_at_all()
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
        extents = {c.id for no in by_number if (c := consumer.flight.cursor_of(no))}
        stale_numbers = action(list(by_number))
        stale.extend(by_number[no] for no in stale_numbers)
        return len(by_number) - len(stale_numbers), stale, extents
